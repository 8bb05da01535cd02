#!/usr/bin/env bash
# The project's one test command (README, and what .ci/run calls).
# It sets up both environments itself, then runs both test tiers:
#   .venv         ComfyUI-side environment: requirements.txt + torch + pytest, package editable
#   .venv-server  server environment: the pinned vllm + vllm-omni (server/create_server_env.sh)
# Extra arguments go to pytest (e.g. tests/unit -k spec).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e ".[test]" "torch==2.13.0"

# uv builds the server environment in under a minute (pip takes several). Where none is on
# PATH it is installed inside .venv, never into the machine's python, and only `setup` below
# sees it (through .venv/tools, which holds uv alone: .venv/bin's python must not shadow the
# interpreter create_server_env.sh picks for the server).
setup_path="$PATH"
if ! command -v uv >/dev/null 2>&1; then
  .venv/bin/python -m pip install -q uv
  mkdir -p .venv/tools
  ln -sf ../bin/uv .venv/tools/uv
  setup_path="$root/.venv/tools:$PATH"
fi

# The server environment is made the way the README tells users: `setup` (which runs
# server/create_server_env.sh when needed, then checks the pair and torch): CI thereby tests
# the first-run path from scratch against the real pinned upstream.
PATH="$setup_path" VLLM_OMNI_LAUNCHER_CONFIG="$root/.pytest_cache/no-config.json" \
  .venv/bin/python -m vllm_omni_launcher setup --path "$root/.venv-server"

# uv installs no bytecode, and with PYTHONDONTWRITEBYTECODE set none is ever written: then
# every stub server start compiles ~9000 modules of vllm, torch & co. from source, which
# doubles its time (about 70 s instead of 30 s on a busy 2-core box). Compile them once, and
# again only after an install changed site-packages. Some packages ship files that are not
# Python 3 (compileall reports them); they are never imported.
precompile() {
  local env="$1" stamp="$1/.bytecode-compiled" site
  site="$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  if [ -f "$stamp" ] && [ -z "$(find "$site" -maxdepth 1 -newer "$stamp" -print -quit)" ]; then
    return 0
  fi
  echo "compiling the bytecode of $env (once)"
  "$env/bin/python" -m compileall -q -j 0 "$site" >/dev/null 2>&1 || true
  touch "$stamp"
}
precompile "$root/.venv-server"

# The 0.26 line's vLLM-Omni wheel, downloaded once and never installed: the stub's copies of
# upstream log lines are checked inside it (tests/contract/upstream_lines.py reads the zip) as
# well as in the installed 0.30, so a line either supported version no longer logs fails.
wheels="$root/.pytest_cache/upstream-wheels"
if [ ! -f "$wheels/vllm_omni-0.26.0-py3-none-any.whl" ]; then
  .venv/bin/python -m pip download -q --no-deps -d "$wheels" "vllm-omni==0.26.0"
fi

export VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON="$root/.venv-server/bin/python"
# Tests must never touch the user's real launcher config or data.
export VLLM_OMNI_LAUNCHER_CONFIG="$root/.pytest_cache/no-config.json"
set +e
# Two pytest-xdist workers: most of the time goes into stub servers importing vLLM (one
# core each) and into tests waiting on them, which leaves the second core of a 2-core box
# idle when tests run one at a time.  Tests that share a server process run in one worker
# (xdist groups, tests/contract/conftest.py); every worker has its own temp and data dirs.
# VLLM_OMNI_LAUNCHER_TEST_WORKERS=0 runs everything in this process, one test at a time.
# --durations: the slowest tests at the end of every log, so CI shows where the time goes.
# -rs: the reason of every skip in the summary (the real-ComfyUI tier skips without COMFYUI_DIR),
# so a skipped tier is visible in the CI log, never silent.
.venv/bin/python -m pytest -q -rs -p no:cacheprovider -n "${VLLM_OMNI_LAUNCHER_TEST_WORKERS:-2}" --dist loadgroup \
  --durations=15 "${@:-tests}"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "tests/run.sh: pytest collected no tests (exit 5): that is a failure" >&2
fi
exit "$rc"
