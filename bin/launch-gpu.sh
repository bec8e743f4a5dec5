# shellcheck shell=bash
# The real stack on one NVIDIA machine without Docker, sourced by launch.sh (`./launch.sh gpu`, `./launch.sh resume`).
#
#   vLLM in its own venv (.venv-vllm: its torch never replaces the learner's pinned one in .venv), the model
#   downloaded once into the Hugging Face cache, vLLM started with the flags training needs, then `halo up`
#   (Temporal, workers, the learner with HALO_MODEL on the same model) and `halo train` on the REAL config.
#
# gpu_plan / resume_plan print the commands, one per line (what --dry-run shows and the tests check); gpu_run /
# resume_run execute them. Settings (environment):
#   HALO_GPU_MODEL        model served and trained (default Qwen/Qwen3-VL-8B-Instruct)
#   HALO_GPU_CONFIG       training config (default configs/grpo-real.yaml)
#   HALO_LORA_RANK        the adapters' rank (default 16); vLLM's --max-lora-rank is at least this (and 64)
#   HALO_VLLM_GPU_UTIL    vLLM's share of GPU memory (default 0.5: the learner holds the model and LoRA state too)
#   HALO_VLLM_PORT        default 8000;  HALO_VLLM_MAX_MODEL_LEN default 16384
#   HALO_VLLM_VERSION     pip pin of vLLM (default 0.33.0, the docker-compose image's)
#   HALO_POLICY_API_KEY   when set, vLLM requires it (--api-key) and the workers send it
#   HALO_LAUNCH_STATE     what `gpu` started, for `resume` (default runs/launch-state.env)

: "${HALO_GPU_MODEL:=Qwen/Qwen3-VL-8B-Instruct}"
: "${HALO_GPU_CONFIG:=configs/grpo-real.yaml}"
: "${HALO_VLLM_GPU_UTIL:=0.5}"
: "${HALO_VLLM_PORT:=8000}"
: "${HALO_VLLM_MAX_MODEL_LEN:=16384}"
: "${HALO_VLLM_VERSION:=0.33.0}"
: "${HALO_LAUNCH_STATE:=runs/launch-state.env}"

# vLLM accepts these LoRA ranks (workers/learner/halo_learner/models.py VLLM_LORA_RANKS).
gpu_max_lora_rank() {
  local rank="${HALO_LORA_RANK:-16}" r
  for r in 64 128 256 320 512; do
    if [ "$rank" -le "$r" ]; then echo "$r"; return 0; fi
  done
  echo "launch: HALO_LORA_RANK=$rank is above vLLM's largest LoRA rank (512)" >&2
  return 1
}

# The vLLM server command (environment assignments first). The key is referenced, never printed.
gpu_vllm_command() {
  local max_rank
  max_rank="$(gpu_max_lora_rank)" || return 1
  local cmd="VLLM_ALLOW_RUNTIME_LORA_UPDATING=True setsid .venv-vllm/bin/vllm serve $HALO_GPU_MODEL --host 127.0.0.1 --port $HALO_VLLM_PORT"
  cmd+=" --enable-lora --max-lora-rank $max_rank --max-loras 2 --max-cpu-loras 4"
  cmd+=" --gpu-memory-utilization $HALO_VLLM_GPU_UTIL --max-model-len $HALO_VLLM_MAX_MODEL_LEN"
  cmd+=" --limit-mm-per-prompt.video 0 --generation-config vllm --logprobs-mode processed_logprobs"
  if [ -n "${HALO_POLICY_API_KEY:-}" ]; then cmd+=' --api-key "$HALO_POLICY_API_KEY"'; fi
  echo "$cmd"
}

# The learner's environment: the same model as vLLM, the same LoRA rank.
gpu_learner_env() {
  echo "HALO_MODEL=$HALO_GPU_MODEL HALO_LORA_RANK=${HALO_LORA_RANK:-16}"
}

gpu_wait_vllm() {
  echo "until curl -sf http://127.0.0.1:$HALO_VLLM_PORT/health >/dev/null; do kill -0 \$(cat runs/pids/vllm.pid) || { tail -n 40 runs/logs/vllm.log; exit 1; }; sleep 5; done"
}

gpu_start_vllm() {
  echo "{ mkdir -p runs/logs runs/pids && ( $(gpu_vllm_command) > runs/logs/vllm.log 2>&1 < /dev/null & echo \$! > runs/pids/vllm.pid ); }"
}

# Every command of `./launch.sh gpu`, in order; extra arguments go to `halo train`.
gpu_plan() {
  local extra="" a
  for a in "$@"; do extra+=" $(printf '%q' "$a")"; done
  gpu_max_lora_rank >/dev/null || return 1
  local py="python3"
  echo "command -v nvidia-smi >/dev/null || { echo 'launch: no nvidia-smi: ./launch.sh gpu needs an NVIDIA GPU and its driver (the local stack: ./launch.sh)' >&2; exit 1; }; nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv"
  echo "[ -x .venv-vllm/bin/python ] || $py -m venv .venv-vllm"
  echo "[ -x .venv-vllm/bin/vllm ] || .venv-vllm/bin/pip install --disable-pip-version-check vllm==$HALO_VLLM_VERSION"
  echo ".venv-vllm/bin/hf download $HALO_GPU_MODEL"
  gpu_state_command
  echo "curl -sf http://127.0.0.1:$HALO_VLLM_PORT/health >/dev/null || $(gpu_start_vllm)"
  gpu_wait_vllm
  echo "$(gpu_learner_env) npx halo up"
  echo "$(gpu_learner_env) npx halo train --config $(printf '%q' "$HALO_GPU_CONFIG")$extra"
}

# Records what runs, so `./launch.sh resume` brings back the same thing (never the local default job).
gpu_state_command() {
  local vars
  vars="$(printf ' %q' HALO_LAUNCH_MODE=gpu "HALO_GPU_MODEL=$HALO_GPU_MODEL" "HALO_LORA_RANK=${HALO_LORA_RANK:-16}" \
    "HALO_VLLM_PORT=$HALO_VLLM_PORT" "HALO_VLLM_GPU_UTIL=$HALO_VLLM_GPU_UTIL" "HALO_VLLM_MAX_MODEL_LEN=$HALO_VLLM_MAX_MODEL_LEN" "HALO_GPU_CONFIG=$HALO_GPU_CONFIG")"
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
    echo "curl -sf http://127.0.0.1:$HALO_VLLM_PORT/health >/dev/null || $(gpu_start_vllm)"
    gpu_wait_vllm
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
