# shellcheck shell=bash
# The real stack on one NVIDIA machine without Docker, sourced by launch.sh (`./launch.sh gpu`, `./launch.sh gpu serve`,
# `./launch.sh gpu mcts`, `./launch.sh resume`).
#
#   vLLM in its own venv (.venv-vllm: its torch never replaces the learner's pinned one in .venv), the model
#   downloaded once into the Hugging Face cache, vLLM started with the flags training needs, then `halo up`
#   (Temporal, workers, the learner with HALO_MODEL on the same model) and `halo train` (or, `gpu mcts`,
#   `halo mcts`) on the REAL config; `gpu serve` stops once vLLM answers.
#
# gpu_plan / gpu_serve_plan / resume_plan print the commands, one per line (what --dry-run shows and the tests
# check); launch.sh's run_plan executes them. The one vLLM command line is gpu_vllm_command's: the configs' headers
# and docs/episodes.md quote it, and test/unit/launch.test.ts holds them to it. Settings (environment):
#   HALO_GPU_MODEL        model served and trained (default Qwen/Qwen3-VL-8B-Instruct)
#   HALO_GPU_CONFIG       training config (default configs/grpo-real.yaml)
#   HALO_GPU_MCTS_CONFIG  MCTS config of `gpu mcts` (default configs/mcts-real.yaml)
#   HALO_LORA_RANK        the adapters' rank (default 16); vLLM's --max-lora-rank is at least this (and 64)
#   HALO_VLLM_GPU_UTIL    vLLM's share of GPU memory on one GPU (default 0.5: the learner holds the model and LoRA state too)
#   HALO_VLLM_PORT        default 8000 (replica i of several listens on HALO_VLLM_PORT + i - 1);
#                         HALO_VLLM_MAX_MODEL_LEN default 16384
#   HALO_GPUS             GPUs to plan for (default: those `nvidia-smi -L` lists; 1 where it lists none). One GPU: vLLM
#                         and the learner share it. N > 1: the learner on the first HALO_LEARNER_GPUS (default 1) and
#                         one vLLM replica on each other GPU, all sampled as one pool (policy.baseUrls via --policy-url)
#   HALO_LEARNER_GPUS     GPUs of the data-parallel learner on a box of several (default 1; fewer than HALO_GPUS)
#   HALO_VLLM_REPLICA_UTIL  a replica's share of its own GPU (default 0.9: nothing else runs there)
#   HALO_VLLM_VERSION     pip pin of vLLM; unset: 0.33.0 (the docker-compose image's) when a Python it supports
#                         (3.11-3.14) is on PATH or in apt, else the newest release the Python here supports
#                         (0.31.0 on 3.10); the plan says which (gpu_vllm_choice)
#   HALO_VLLM_PYTHON      the Python that builds .venv-vllm (default: python3, python3.12, python3.11, python3.13,
#                         python3.14, the first one vLLM supports)
#   HALO_POLICY_API_KEY   when set (in the environment or in .env, like the CLI reads it), vLLM requires it and
#                         the workers send it; vLLM gets it as VLLM_API_KEY in its environment, never on its
#                         command line (HALO_CREDENTIAL_POLICY_ENV names another variable, as for the workers)
#   HALO_LAUNCH_STATE     what `gpu` started, for `resume` (default runs/launch-state.env)

: "${HALO_GPU_MODEL:=Qwen/Qwen3-VL-8B-Instruct}"
: "${HALO_GPU_CONFIG:=configs/grpo-real.yaml}"
: "${HALO_GPU_MCTS_CONFIG:=configs/mcts-real.yaml}"
: "${HALO_VLLM_GPU_UTIL:=0.5}"
: "${HALO_VLLM_PORT:=8000}"
: "${HALO_VLLM_MAX_MODEL_LEN:=16384}"
# vLLM's default pin (the docker-compose image's) and the newest release that still installs on Python 3.10
# (0.32.0 and later: Requires-Python >=3.11,<3.15; 0.31.0: >=3.10,<3.15).
GPU_VLLM_DEFAULT=0.33.0
GPU_VLLM_NEWEST_PY310=0.31.0
GPU_PY_MAX_MINOR=14
# vLLM's xgrammar backend reads free whitespace from this server setting only (the request's is ignored).
GPU_STRUCTURED_OUTPUTS='{"backend":"xgrammar","disable_any_whitespace":true}'
: "${HALO_LAUNCH_STATE:=runs/launch-state.env}"

# The split of the box's GPUs (gpu_split): GPU_N GPUs; the learner's devices GPU_LEARNER_DEVICES (empty on one GPU,
# where vLLM and the learner share it as they always did); one vLLM replica per entry of GPU_REPLICA_DEVICES (empty
# entry: no CUDA_VISIBLE_DEVICES, the one shared GPU) at GPU_REPLICA_UTIL; GPU_POLICY_URLS the comma-separated pool.
gpu_split() {
  local n="${HALO_GPUS:-}" k="${HALO_LEARNER_GPUS:-1}" g learner=()
  if [ -z "$n" ]; then
    n=0
    if command -v nvidia-smi >/dev/null 2>&1; then n="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')" || n=0; fi
    [ "$n" -ge 1 ] || n=1
  fi
  if ! [[ "$n" =~ ^[1-9][0-9]*$ ]]; then echo "launch: HALO_GPUS=$n: a number of GPUs, 1 or more" >&2; return 1; fi
  if ! [[ "$k" =~ ^[1-9][0-9]*$ ]]; then echo "launch: HALO_LEARNER_GPUS=$k: a number of GPUs, 1 or more" >&2; return 1; fi
  GPU_N="$n"
  GPU_REPLICA_DEVICES=()
  if [ "$n" -eq 1 ]; then
    GPU_LEARNER_DEVICES="" GPU_REPLICA_DEVICES=("") GPU_REPLICA_UTIL="$HALO_VLLM_GPU_UTIL"
  else
    if [ "$k" -ge "$n" ]; then echo "launch: HALO_LEARNER_GPUS=$k leaves none of the $n GPUs for vLLM: at most $((n - 1))" >&2; return 1; fi
    for ((g = 0; g < k; g++)); do learner+=("$g"); done
    GPU_LEARNER_DEVICES="$(IFS=,; echo "${learner[*]}")"
    for ((g = k; g < n; g++)); do GPU_REPLICA_DEVICES+=("$g"); done
    GPU_REPLICA_UTIL="${HALO_VLLM_REPLICA_UTIL:-0.9}"
  fi
  local urls=() i
  for ((i = 0; i < ${#GPU_REPLICA_DEVICES[@]}; i++)); do urls+=("http://127.0.0.1:$(gpu_replica_port "$i")/v1"); done
  GPU_POLICY_URLS="$(IFS=,; echo "${urls[*]}")"
}

# Replica i (from 0): its port, and its name for the pid and log files (the first keeps vllm, as on one GPU).
gpu_replica_port() { echo $((HALO_VLLM_PORT + $1)); }
gpu_replica_name() { if [ "$1" -eq 0 ]; then echo vllm; else echo "vllm-$(($1 + 1))"; fi; }

# What the split is, said in the plan.
gpu_split_note() {
  local r="${#GPU_REPLICA_DEVICES[@]}"
  if [ "$GPU_N" -eq 1 ]; then
    echo "# 1 GPU: vLLM (--gpu-memory-utilization $GPU_REPLICA_UTIL) and the learner share it"
  else
    echo "# $GPU_N GPUs: the learner on GPU $GPU_LEARNER_DEVICES (HALO_LEARNER_GPUS=${HALO_LEARNER_GPUS:-1}), $r vLLM replica$([ "$r" -eq 1 ] || echo s) on GPU ${GPU_REPLICA_DEVICES[*]} (--gpu-memory-utilization $GPU_REPLICA_UTIL each), sampled as one pool: $GPU_POLICY_URLS"
  fi
}

# vLLM accepts these LoRA ranks (workers/learner/halo_learner/models.py VLLM_LORA_RANKS).
gpu_max_lora_rank() {
  local rank="${HALO_LORA_RANK:-16}" r
  for r in 64 128 256 320 512; do
    if [ "$rank" -le "$r" ]; then echo "$r"; return 0; fi
  done
  echo "launch: HALO_LORA_RANK=$rank is above vLLM's largest LoRA rank (512)" >&2
  return 1
}

# The vLLM server command (environment assignments first). The key is referenced, never printed, and reaches
# vLLM through its environment (VLLM_API_KEY, read like --api-key), so `ps` never shows it.
gpu_vllm_command() {
  local port="${1:-$HALO_VLLM_PORT}" util="${2:-$HALO_VLLM_GPU_UTIL}" device="${3:-}"
  local max_rank key_var
  max_rank="$(gpu_max_lora_rank)" || return 1
  key_var="$(gpu_policy_key_var)"
  local cmd=""
  if [ -n "${!key_var:-}" ]; then cmd+="VLLM_API_KEY=\"\$$key_var\" "; fi
  # A replica of several: its own GPU.
  if [ -n "$device" ]; then cmd+="CUDA_VISIBLE_DEVICES=$device "; fi
  cmd+="VLLM_ALLOW_RUNTIME_LORA_UPDATING=True setsid .venv-vllm/bin/vllm serve $HALO_GPU_MODEL --host 127.0.0.1 --port $port"
  cmd+=" --enable-lora --max-lora-rank $max_rank --max-loras 2 --max-cpu-loras 4"
  cmd+=" --gpu-memory-utilization $util --max-model-len $HALO_VLLM_MAX_MODEL_LEN"
  cmd+=" --limit-mm-per-prompt.video 0 --generation-config vllm --logprobs-mode processed_logprobs"
  # Constrained decoding without free whitespace, the grammar the learner compiles (policy.grammarWhitespace compact).
  cmd+=" --structured-outputs-config '$GPU_STRUCTURED_OUTPUTS'"
  echo "$cmd"
}

# The learner's environment: the same model as vLLM, the same LoRA rank.
# The workers send the policy key to loopback only at this port (lib/serving/credentials.ts), so they are told it; on a box of
# several GPUs also the learner's GPUs and the other replicas' origins.
gpu_learner_env() {
  local env="HALO_MODEL=$HALO_GPU_MODEL HALO_LORA_RANK=${HALO_LORA_RANK:-16} HALO_VLLM_PORT=$HALO_VLLM_PORT" i origins=()
  if [ "${GPU_N:-1}" -gt 1 ]; then
    for ((i = 1; i < ${#GPU_REPLICA_DEVICES[@]}; i++)); do origins+=("http://127.0.0.1:$(gpu_replica_port "$i")"); done
    env+=" CUDA_VISIBLE_DEVICES=$GPU_LEARNER_DEVICES HALO_LEARNER_GPUS=${HALO_LEARNER_GPUS:-1}"
    if [ "${#origins[@]}" -gt 0 ]; then env+=" HALO_CREDENTIAL_POLICY_ORIGINS=${HALO_CREDENTIAL_POLICY_ORIGINS:+$HALO_CREDENTIAL_POLICY_ORIGINS,}$(IFS=,; echo "${origins[*]}")"; fi
  fi
  echo "$env"
}

# Waits for replica i (default 0) to answer, or shows its log's end when its process died.
gpu_wait_vllm() {
  local i="${1:-0}" name port
  name="$(gpu_replica_name "$i")" port="$(gpu_replica_port "$i")"
  echo "until curl -sf http://127.0.0.1:$port/health >/dev/null; do kill -0 \$(cat runs/pids/$name.pid) || { tail -n 40 runs/logs/$name.log; exit 1; }; sleep 5; done"
}

# Starts replica i (default 0) in the background: its pid in runs/pids/<name>.pid, which `halo down` stops.
gpu_start_vllm() {
  local i="${1:-0}" name
  name="$(gpu_replica_name "$i")"
  echo "{ mkdir -p runs/logs runs/pids && ( $(gpu_vllm_command "$(gpu_replica_port "$i")" "${GPU_REPLICA_UTIL:-$HALO_VLLM_GPU_UTIL}" "${GPU_REPLICA_DEVICES[$i]:-}") > runs/logs/$name.log 2>&1 < /dev/null & echo \$! > runs/pids/$name.pid ); }"
}

# Every replica of the split started (one already answering is left as it is), then waited for.
gpu_start_replicas() {
  local i
  for ((i = 0; i < ${#GPU_REPLICA_DEVICES[@]}; i++)); do
    echo "curl -sf http://127.0.0.1:$(gpu_replica_port "$i")/health >/dev/null || $(gpu_start_vllm "$i")"
  done
  for ((i = 0; i < ${#GPU_REPLICA_DEVICES[@]}; i++)); do gpu_wait_vllm "$i"; done
}

# The minor version (10 for 3.10) of a Python command, from `<cmd> --version`; fails when there is none.
gpu_py_minor() {
  local v
  command -v "$1" >/dev/null 2>&1 || return 1
  v="$("$1" --version 2>&1)" || return 1
  [[ "$v" =~ ^Python\ 3\.([0-9]+) ]] || return 1
  echo "${BASH_REMATCH[1]}"
}

# The oldest Python minor version a vLLM release installs on (its Requires-Python): 3.11 from 0.32.0 on.
gpu_vllm_min_minor() {
  local major="${1%%.*}" rest="${1#*.}"
  local minor="${rest%%.*}"
  if [ "$major" -gt 0 ] 2>/dev/null || [ "$minor" -ge 32 ] 2>/dev/null; then echo 11; else echo 10; fi
}

# Whether apt can install python3.<minor>-venv (Debian/Ubuntu; read-only: apt-cache policy).
gpu_apt_has() {
  command -v apt-cache >/dev/null 2>&1 || return 1
  apt-cache policy "$1" 2>/dev/null | grep -q 'Candidate: [0-9]'
}

# Which Python builds .venv-vllm and which vLLM goes into it. Sets GPU_PY (command), GPU_PY_MINOR, GPU_VLLM,
# GPU_APT (Debian packages to install first, or empty) and GPU_NOTE (the choice, said aloud). In order: a
# Python on PATH that the pin supports; one apt can install; else, unless HALO_VLLM_VERSION pins it, the
# newest vLLM the Python here supports (0.31.0 on 3.10, 22.04's). Reads only; installs nothing.
gpu_vllm_choice() {
  local pin="${HALO_VLLM_VERSION:-$GPU_VLLM_DEFAULT}" lo c m cands=()
  lo="$(gpu_vllm_min_minor "$pin")"
  GPU_APT=""
  GPU_VLLM="$pin"
  if [ -n "${HALO_VLLM_PYTHON:-}" ]; then cands=("$HALO_VLLM_PYTHON"); else cands=(python3 python3.12 python3.11 python3.13 python3.14); fi
  for c in "${cands[@]}"; do
    m="$(gpu_py_minor "$c")" || continue
    if [ "$m" -ge "$lo" ] && [ "$m" -le "$GPU_PY_MAX_MINOR" ]; then
      GPU_PY="$c" GPU_PY_MINOR="$m"
      GPU_NOTE="vLLM $pin on Python 3.$m ($c) in .venv-vllm"
      return 0
    fi
  done
  if [ -z "${HALO_VLLM_PYTHON:-}" ]; then
    for m in 12 11; do
      [ "$m" -ge "$lo" ] || continue
      if gpu_apt_has "python3.$m-venv"; then
        GPU_PY="python3.$m" GPU_PY_MINOR="$m" GPU_APT="python3.$m python3.$m-venv python3.$m-dev"
        GPU_NOTE="vLLM $pin needs Python 3.$lo-3.$GPU_PY_MAX_MINOR and none is on PATH: installing apt's $GPU_APT, then vLLM $pin on Python 3.$m in .venv-vllm"
        return 0
      fi
    done
  fi
  for c in "${cands[@]}"; do
    m="$(gpu_py_minor "$c")" || continue
    if [ -z "${HALO_VLLM_VERSION:-}" ] && [ "$m" -eq 10 ]; then
      GPU_PY="$c" GPU_PY_MINOR="$m" GPU_VLLM="$GPU_VLLM_NEWEST_PY310"
      GPU_NOTE="vLLM $GPU_VLLM on Python 3.10 ($c) in .venv-vllm: the newest release for 3.10 ($GPU_VLLM_DEFAULT and every release from 0.32.0 need Python >= 3.11, and neither PATH nor apt has one; with python3.11 or python3.12 installed, or HALO_VLLM_PYTHON naming one, ./launch.sh gpu takes $GPU_VLLM_DEFAULT)"
      return 0
    fi
    echo "launch: vLLM $pin needs Python 3.$lo-3.$GPU_PY_MAX_MINOR; $c is Python 3.$m (install python3.12 or python3.11, or set HALO_VLLM_PYTHON${HALO_VLLM_VERSION:+ or another HALO_VLLM_VERSION})" >&2
    return 1
  done
  echo "launch: no Python for vLLM's venv (tried ${cands[*]}): install python3.12 or python3.11 (with its venv module), or set HALO_VLLM_PYTHON" >&2
  return 1
}

# The variable the policy key is read from: HALO_POLICY_API_KEY unless HALO_CREDENTIAL_POLICY_ENV names
# another (the workers' mapping, lib/serving/credentials.ts).
gpu_policy_key_var() {
  local v="${HALO_CREDENTIAL_POLICY_ENV:-}"
  v="${v#"${v%%[![:space:]]*}"}"; v="${v%"${v##*[![:space:]]}"}"
  [[ "$v" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || v=HALO_POLICY_API_KEY
  echo "$v"
}

# One variable's value in .env (HALO_ENV_FILE names another file; empty: none), in the one .env grammar of
# host/env-file.ts (the npm dotenv package's) and halo_learner/envfile.py (its port): this asks the latter, so
# the three readers cannot disagree (`K=abc#def` is `abc`, quoted values may span lines, `export ` allowed, the
# last assignment wins). Fails when the file or the variable is not there. The file is read, never sourced.
gpu_dotenv_get() {
  local name="$1" file="${HALO_ENV_FILE-.env}" learner py
  [ -n "$file" ] && [ -r "$file" ] || return 1
  learner="$(dirname "${BASH_SOURCE[0]}")/../workers/learner"
  py="$(command -v python3)" || { say "python3 not found: cannot read $name from $file" >&2; return 1; }
  # -I: no user site, no PYTHON* variables; the value goes to stdout only (never to a log).
  "$py" -I -c '
import sys
sys.path.insert(0, sys.argv[1])
from halo_learner.envfile import parse_env
with open(sys.argv[2], encoding="utf-8", newline="") as f:
    values = parse_env(f.read())
if sys.argv[3] not in values:
    sys.exit(1)
sys.stdout.write(values[sys.argv[3]])
' "$learner" "$file" "$name"
}

# The policy key for vLLM, from the environment or else from .env (as the CLI and the workers read it), exported
# so the plan's commands hand it to vLLM. Sets GPU_KEY_FROM. A variable already set, even empty, wins over .env.
gpu_load_policy_key() {
  local var v
  if [ -z "${HALO_CREDENTIAL_POLICY_ENV+x}" ] && v="$(gpu_dotenv_get HALO_CREDENTIAL_POLICY_ENV)"; then export HALO_CREDENTIAL_POLICY_ENV="$v"; fi
  var="$(gpu_policy_key_var)"
  GPU_KEY_FROM="environment"
  if [ -z "${!var+x}" ] && v="$(gpu_dotenv_get "$var")"; then
    export "$var=$v"
    GPU_KEY_FROM="from ${HALO_ENV_FILE-.env}"
  fi
  export GPU_KEY_FROM
}

# What every GPU job does first: the driver checked, vLLM installed, the model downloaded.
gpu_prepare_plan() {
  gpu_max_lora_rank >/dev/null || return 1
  gpu_vllm_choice || return 1
  local key_var
  key_var="$(gpu_policy_key_var)"
  echo "command -v nvidia-smi >/dev/null || { echo 'launch: no nvidia-smi: ./launch.sh gpu needs an NVIDIA GPU and its driver (the local job: ./launch.sh local)' >&2; exit 1; }; nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv"
  echo "# $GPU_NOTE"
  if [ -n "$GPU_APT" ]; then
    local sudo="sudo "
    [ "$(id -u)" != 0 ] || sudo=""
    echo "command -v $GPU_PY >/dev/null || { ${sudo}apt-get update -qq && DEBIAN_FRONTEND=noninteractive ${sudo}apt-get install -y -qq $GPU_APT; }"
  fi
  # A .venv-vllm of another Python (an earlier try with the system's) is rebuilt; the pin is checked, not just vLLM's presence.
  echo "{ [ -x .venv-vllm/bin/python ] && .venv-vllm/bin/python -c 'import sys; sys.exit(sys.version_info[:2] != (3, $GPU_PY_MINOR))'; } || $GPU_PY -m venv --clear .venv-vllm"
  echo ".venv-vllm/bin/python -c 'import importlib.metadata as m, sys; sys.exit(m.version(\"vllm\") != \"$GPU_VLLM\")' 2>/dev/null || .venv-vllm/bin/pip install --disable-pip-version-check vllm==$GPU_VLLM"
  if [ -n "${!key_var:-}" ]; then
    echo "# vLLM requires the policy key: \$$key_var (${GPU_KEY_FROM:-environment}) is passed as VLLM_API_KEY in vLLM's environment, never on its command line"
  else
    echo "# no policy key (\$$key_var is empty or unset, in the environment and in .env): vLLM accepts requests without one"
  fi
  echo ".venv-vllm/bin/hf download $HALO_GPU_MODEL"
}

# `./launch.sh gpu serve`: vLLM alone, started in the background and left running for a later `./launch.sh gpu`
# (which finds it healthy), `halo train --policy-url`, or any OpenAI client.
gpu_serve_plan() {
  gpu_split || return 1
  gpu_prepare_plan || return 1
  gpu_split_note
  gpu_start_replicas
  if [ "$GPU_N" -eq 1 ]; then
    echo "# vLLM serves $HALO_GPU_MODEL at http://127.0.0.1:$HALO_VLLM_PORT/v1 (log runs/logs/vllm.log); the learner then needs HALO_MODEL=$HALO_GPU_MODEL HALO_LORA_RANK=${HALO_LORA_RANK:-16}; stop it with npx halo down or ./teardown.sh"
  else
    echo "# ${#GPU_REPLICA_DEVICES[@]} vLLM replicas serve $HALO_GPU_MODEL at $GPU_POLICY_URLS (logs runs/logs/vllm*.log; halo train --policy-url takes the list); the learner then needs $(gpu_learner_env); stop them with npx halo down or ./teardown.sh"
  fi
}

# Every command of `./launch.sh gpu` (job train) or `./launch.sh gpu mcts` (job mcts), in order; extra arguments
# go to `halo train` or `halo mcts`.
gpu_plan() {
  local job="$1" extra="" a config
  shift
  for a in "$@"; do extra+=" $(printf '%q' "$a")"; done
  if [ "$job" = mcts ]; then config="$HALO_GPU_MCTS_CONFIG"; else config="$HALO_GPU_CONFIG"; fi
  gpu_split || return 1
  gpu_prepare_plan || return 1
  gpu_split_note
  gpu_state_command
  gpu_start_replicas
  echo "$(gpu_learner_env) npx halo up"
  # Several replicas: the run samples from all of them (policy.baseUrls) and loads each adapter into each.
  local pool=""
  [ "$GPU_N" -eq 1 ] || pool=" --policy-url $GPU_POLICY_URLS"
  echo "$(gpu_learner_env) npx halo $job --config $(printf '%q' "$config")$pool$extra"
}

# Records what runs, so `./launch.sh resume` brings back the same thing (never the local default job).
gpu_state_command() {
  local vars
  vars="$(printf ' %q' HALO_LAUNCH_MODE=gpu "HALO_GPU_MODEL=$HALO_GPU_MODEL" "HALO_LORA_RANK=${HALO_LORA_RANK:-16}" \
    "HALO_VLLM_PORT=$HALO_VLLM_PORT" "HALO_VLLM_GPU_UTIL=$HALO_VLLM_GPU_UTIL" "HALO_VLLM_MAX_MODEL_LEN=$HALO_VLLM_MAX_MODEL_LEN" "HALO_GPU_CONFIG=$HALO_GPU_CONFIG" \
    "HALO_GPUS=$GPU_N" "HALO_LEARNER_GPUS=${HALO_LEARNER_GPUS:-1}" "HALO_VLLM_REPLICA_UTIL=${HALO_VLLM_REPLICA_UTIL:-0.9}")"
  echo "mkdir -p $(dirname "$HALO_LAUNCH_STATE") && printf '%s\\n'$vars > $HALO_LAUNCH_STATE"
}

# `./launch.sh resume`: the stack that was running, then every open run resumed; no new job is started.
resume_plan() {
  local mode=local from="no $HALO_LAUNCH_STATE: the local stack"
  if [ -f "$HALO_LAUNCH_STATE" ]; then
    from="$HALO_LAUNCH_STATE"
    # shellcheck disable=SC1090
    . "$HALO_LAUNCH_STATE"
    mode="${HALO_LAUNCH_MODE:-local}"
  fi
  echo "# resuming the $mode stack ($from); no new job is started"
  if [ "$mode" = gpu ]; then
    gpu_max_lora_rank >/dev/null || return 1
    gpu_split || return 1
    gpu_split_note
    gpu_start_replicas
    echo "$(gpu_learner_env) npx halo up"
    echo "for run in \$(npx halo runs --status Running --json | node -e 'for (const r of JSON.parse(require(\"fs\").readFileSync(0, \"utf8\"))) console.log(r.workflowId)'); do $(gpu_learner_env) npx halo resume \"\$run\"; done"
  else
    echo "npx halo up"
    echo "for run in \$(npx halo runs --status Running --json | node -e 'for (const r of JSON.parse(require(\"fs\").readFileSync(0, \"utf8\"))) console.log(r.workflowId)'); do npx halo resume \"\$run\"; done"
  fi
}

# Local stack's state for `resume` (the default job and anything started by `./launch.sh`).
local_state_command() {
  echo "mkdir -p $(dirname "$HALO_LAUNCH_STATE") && [ -f $HALO_LAUNCH_STATE ] || printf 'HALO_LAUNCH_MODE=local\n' > $HALO_LAUNCH_STATE"
}

# Runs a plan's lines one by one (each in bash -c, with the caller's environment), or prints them with --dry-run.
run_plan() {
  local dry="$1"; shift
  local line plan
  plan="$("$@")" || return 1
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    if [ "$dry" = 1 ]; then
      echo "$line"
    else
      case "$line" in "#"*) printf '\033[1mlaunch:\033[0m %s\n' "${line#\# }" >&2; continue ;; esac
      printf '\033[1mlaunch:\033[0m %s\n' "$line" >&2
      bash -c "set -euo pipefail; $line" || return 1
    fi
  done <<< "$plan"
}
