#!/usr/bin/env bash
# Stops every stack of this repository gracefully, saying what it stopped: what `./launch.sh` and
# `./launch.sh gpu` started (workers, the learner, Temporal's dev server and vLLM: the pid files in runs/pids,
# stopped by `npx halo down`) and the docker-compose stack (docker-compose.yml). Nothing is deleted: Temporal's
# database (runs/temporal.db, or the volume temporal-postgres), the model cache (hf-cache), ./runs and
# ./checkpoints stay; `./launch.sh resume` or `docker compose up -d` resumes every run where it stopped.
#
#   ./teardown.sh              stop: workers first (they finish their running activities), then the rest
#   ./teardown.sh --purge      also remove the compose containers and the named volumes (asks for confirmation;
#                              ./runs and ./checkpoints are repository folders and are never touched)
#   ./teardown.sh --purge --yes   the same without asking
#   ./teardown.sh --home DIR   the runs folder of the launch.sh stack (default runs; as given to `halo up --home`)
#   ./teardown.sh --compose-only  only the docker-compose stack (what `halo down` calls)
#
# HALO_STOP_TIMEOUT (seconds, default 180) bounds how long a worker may take to finish; it must cover the
# learner's drain (HALO_SHUTDOWN_GRACE_S in docker-compose.yml) so a running update is never cut off.
set -euo pipefail

here="${BASH_SOURCE[0]%/*}"
[ "$here" = "${BASH_SOURCE[0]}" ] && here=.
cd "$here"
# The Node that launch.sh installed from PyPI when the system had none (or too old a one) runs `npx halo down`.
# shellcheck source=bin/launch-node.sh
. bin/launch-node.sh
node_use_project

PURGE=0
YES=0
COMPOSE_ONLY=0
HOME_DIR=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --purge) PURGE=1 ;;
    --yes|-y) YES=1 ;;
    --compose-only) COMPOSE_ONLY=1 ;;
    --home)
      [ "$#" -ge 2 ] || { echo "teardown: --home needs a folder" >&2; exit 2; }
      HOME_DIR="$2"; shift ;;
    --home=*) HOME_DIR="${1#--home=}" ;;
    -h|--help)
      sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "teardown: unknown argument $1 (use --purge, --yes, --home DIR, --compose-only)" >&2
      exit 2
      ;;
  esac
  shift
done

WORKER_TIMEOUT="${HALO_STOP_TIMEOUT:-180}"
WORKERS=(control-worker browser-worker learner)
have_docker=0
command -v docker >/dev/null 2>&1 && have_docker=1

# Ask before anything happens, so a "no" leaves every stack exactly as it was.
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
if [ "$PURGE" = 1 ] && [ "$have_docker" = 0 ]; then
  echo "teardown: --purge removes the docker compose containers and volumes, but docker is not installed here" >&2
  exit 1
fi

stopped_any=0

# The pid a pid file names, if that process is still the one it was: the file holds "<pid> <boot id> <start ticks>"
# (client/processes.ts); after a reboot the pid belongs to another process and is not printed.
live_pid() {
  local pid boot ticks now btime
  read -r pid boot ticks < "$1" || true
  pid="${pid//[!0-9]/}"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  now="$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f20)"
  if [ -n "$boot" ] && [ -n "$ticks" ]; then
    [ "$boot" = "$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)" ] && [ "$now" = "$ticks" ] || return 0
  elif [ -n "$now" ]; then
    # A bare pid: only a process that started before the file was written (2 s of slack) can be the one it names.
    btime="$(sed -n 's/^btime //p' /proc/stat)"
    [ $((btime + now / 100)) -le $(($(stat -c %Y "$1") + 2)) ] || return 0
  fi
  echo "$pid"
}

# The launch.sh stack (./launch.sh, ./launch.sh gpu): its processes have pid files in <home>/pids.
launch_stack() {
  local home="${HOME_DIR:-runs}" f pid name live=()
  for f in "$home"/pids/*.pid; do
    [ -f "$f" ] || continue
    pid="$(live_pid "$f")"
    name="${f##*/}"; name="${name%.pid}"
    if [ -n "$pid" ]; then live+=("$name (pid $pid)"); fi
  done
  if [ "${#live[@]}" -eq 0 ]; then
    echo "teardown: no process of the launch.sh stack runs ($home/pids)"
    return 0
  fi
  echo "teardown: the launch.sh stack runs: ${live[*]}; stopping it with npx halo down"
  local args=(down)
  [ -z "$HOME_DIR" ] || args+=(--home "$HOME_DIR")
  stopped_any=1
  if ! command -v npx >/dev/null 2>&1; then
    # No Node.js (a box that only ran compose before?): SIGTERM to each process group, as halo down would.
    for f in "$home"/pids/*.pid; do
      pid="$(live_pid "$f")"; name="${f##*/}"; name="${name%.pid}"
      if [ -n "$pid" ] && { kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null; }; then echo "teardown: sent SIGTERM to $name (pid $pid; no npx here for halo down)"; fi
      rm -f "$f"
    done
    return 0
  fi
  # halo down says each thing it stops (workers first, then Temporal and vLLM); the compose part is ours.
  HALO_DOWN_COMPOSE=0 npx halo "${args[@]}"
}

# The docker-compose stack: workers first (they finish their running activities), then vLLM, Temporal, Postgres.
compose_stack() {
  local services
  # The replicas of `halo compose-replicas N` are services the base file lacks: without their file compose would
  # neither list nor stop them.
  if [ -z "${COMPOSE_FILE:-}" ] && [ -f docker-compose.replicas.yml ]; then export COMPOSE_FILE=docker-compose.yml:docker-compose.replicas.yml; fi
  if [ "$have_docker" = 0 ]; then
    echo "teardown: docker is not installed here: no docker compose stack to stop"
    return 0
  fi
  if ! services="$(docker compose ps --status running --services 2>/dev/null)"; then
    if [ "$PURGE" = 0 ]; then
      echo "teardown: docker compose does not answer here (no compose plugin or no daemon): no docker compose stack to stop"
      return 0
    fi
    services=""
  fi
  services="$(printf '%s' "$services" | tr '\n' ' ' | sed 's/ *$//')"
  if [ -n "$services" ]; then
    echo "teardown: stopping the compose workers (up to ${WORKER_TIMEOUT}s each to finish running activities)"
    docker compose stop -t "$WORKER_TIMEOUT" "${WORKERS[@]}"
    echo "teardown: stopping vLLM, Temporal and Postgres"
    docker compose stop -t 60
    echo "teardown: stopped the docker compose services: $services"
    stopped_any=1
  else
    echo "teardown: no docker compose service runs"
  fi
  if [ "$PURGE" = 1 ]; then
    echo "teardown: removing containers and volumes"
    docker compose down --volumes --remove-orphans
    stopped_any=1
  fi
}

if [ "$COMPOSE_ONLY" = 0 ]; then launch_stack; fi
compose_stack

if [ "$stopped_any" = 0 ]; then
  echo "teardown: done: nothing was running"
elif [ "$PURGE" = 1 ]; then
  echo "teardown: done (purged)"
else
  # shellcheck disable=SC2016
  echo 'teardown: done; state kept: `./launch.sh resume` or `docker compose up -d` resumes'
fi
