#!/usr/bin/env bash
# Stops the docker-compose stack (docker-compose.yml) gracefully. Nothing is deleted: Temporal's database
# (volume temporal-postgres), the model cache (hf-cache), ./runs and ./checkpoints stay, and
# `docker compose up -d` resumes every run where it stopped.
#
#   ./teardown.sh              stop: workers first (they finish their running activities), then the rest
#   ./teardown.sh --purge      also remove the containers and the named volumes (asks for confirmation;
#                              ./runs and ./checkpoints are repository folders and are never touched)
#   ./teardown.sh --purge --yes   the same without asking
#
# HALO_STOP_TIMEOUT (seconds, default 180) bounds how long a worker may take to finish; it must cover the
# learner's drain (HALO_SHUTDOWN_GRACE_S in docker-compose.yml) so a running update is never cut off.
set -euo pipefail

here="${BASH_SOURCE[0]%/*}"
[ "$here" = "${BASH_SOURCE[0]}" ] && here=.
cd "$here"

PURGE=0
YES=0
for arg in "$@"; do
  case "$arg" in
    --purge) PURGE=1 ;;
    --yes|-y) YES=1 ;;
    -h|--help)
      sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "teardown: unknown argument $arg (use --purge, --yes)" >&2
      exit 2
      ;;
  esac
done

WORKER_TIMEOUT="${HALO_STOP_TIMEOUT:-180}"
WORKERS=(control-worker browser-worker learner)

# Ask before anything happens, so a "no" leaves the stack exactly as it was.
if [ "$PURGE" = 1 ] && [ "$YES" != 1 ]; then
  if [ ! -t 0 ]; then
    echo "teardown: --purge deletes Temporal's database (every workflow history) and the model cache;" >&2
    echo "teardown: refusing without a terminal to confirm on: add --yes to purge non-interactively" >&2
    exit 1
  fi
  echo "This removes the containers and the volumes temporal-postgres (every Temporal workflow history)"
  echo "and hf-cache (downloaded models). ./runs and ./checkpoints are kept."
  read -r -p "Type 'purge' to continue: " answer
  if [ "$answer" != "purge" ]; then
    echo "teardown: nothing removed" >&2
    exit 1
  fi
fi

if ! command -v docker >/dev/null 2>&1; then
  echo "teardown: docker is not installed here" >&2
  exit 1
fi

echo "teardown: stopping the workers (up to ${WORKER_TIMEOUT}s each to finish running activities)"
docker compose stop -t "$WORKER_TIMEOUT" "${WORKERS[@]}"
echo "teardown: stopping vLLM, Temporal and Postgres"
docker compose stop -t 60

if [ "$PURGE" = 1 ]; then
  echo "teardown: removing containers and volumes"
  docker compose down --volumes --remove-orphans
fi
echo "teardown: done$([ "$PURGE" = 1 ] && echo ' (purged)' || echo '; volumes kept, `docker compose up -d` resumes')"
