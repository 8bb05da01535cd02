#!/usr/bin/env bash
# Create the SERVER environment: a separate venv holding vLLM and vLLM-Omni (pinned pair).
# It never touches ComfyUI's environment. `python -m vllm_omni_launcher setup` runs it (and then
# checks the result); the launcher finds the default PATH by itself, any other one needs
#   export VLLM_OMNI_LAUNCHER_SERVER_ENV=<path>
#
# usage: server/create_server_env.sh [PATH] [--python PYTHON] [--version X.Y.Z]
#   PATH      where to create the venv (default: ${XDG_DATA_HOME:-~/.local/share}/vllm-omni-launcher/server-env,
#             the launcher's default server env: server/config/server_env.py uses the same rule)
#   --python  interpreter for the venv (default: python3.12 if present, else python3)
#   --version vLLM / vLLM-Omni version; both get the same one (default 0.30.0).
#             Their major.minor must match: a mismatch only warns upstream, then misbehaves.
set -euo pipefail

data_home="${XDG_DATA_HOME:-}"
target="${data_home:-$HOME/.local/share}/vllm-omni-launcher/server-env"
python_bin=""
version="0.30.0"
while [ $# -gt 0 ]; do
  case "$1" in
    --python) python_bin="$2"; shift 2 ;;
    --version) version="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) target="$1"; shift ;;
  esac
done
if [ -z "$python_bin" ]; then
  # The first interpreter that really runs (a pyenv shim may exist without its version).
  for cand in python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 python3; do
    if "$cand" -c 'import sys; assert sys.version_info >= (3, 10)' >/dev/null 2>&1; then
      python_bin="$cand"; break
    fi
  done
fi

if [ -x "$target/bin/python" ] && "$target/bin/python" - "$version" <<'PY' 2>/dev/null; then
import sys
from importlib.metadata import version
want = sys.argv[1]
sys.exit(0 if version("vllm") == want and version("vllm-omni") == want else 1)
PY
  echo "server env at $target already has vllm==$version and vllm-omni==$version"
  exit 0
fi

echo "creating server env at $target (python: $python_bin, vllm/vllm-omni $version)"
if command -v uv >/dev/null 2>&1; then
  # uv's own progress (resolving, downloading, installing) goes to the terminal.
  uv venv --allow-existing -p "$python_bin" "$target"
  # --compile-bytecode: uv leaves .py files uncompiled (pip compiles by default), and the first server
  # start would then compile vllm, vllm-omni and torch on import while ComfyUI waits on Local Server
  # (bench/server_import_bytecode.py measures the difference); here it happens during setup instead.
  VIRTUAL_ENV="$target" uv pip install --compile-bytecode "vllm==$version" "vllm-omni==$version"
else
  "$python_bin" -m venv "$target"
  "$target/bin/python" -m pip install -q --upgrade pip
  "$target/bin/python" -m pip install --progress-bar on "vllm==$version" "vllm-omni==$version"
fi
"$target/bin/python" -c "from importlib.metadata import version as v; print('server env ready: vllm', v('vllm'), 'vllm-omni', v('vllm-omni'))"
default_target="${data_home:-$HOME/.local/share}/vllm-omni-launcher/server-env"
if [ "$target" != "$default_target" ]; then
  echo "now: export VLLM_OMNI_LAUNCHER_SERVER_ENV=$target   (only the default location, $default_target, is found without it)"
fi
