#!/usr/bin/env bash
# The project's one test command (README, and what .ci/run calls).
# It sets up both environments itself, then runs both test tiers:
#   .venv         ComfyUI-side environment: requirements.txt + torch + pytest, package editable
#   .venv-server  server environment: the pinned vllm + vllm-omni (server/create_server_env.sh)
# Extra arguments go to pytest (e.g. tests/unit -k spec).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

if ! command -v uv >/dev/null 2>&1; then
  python3 -m pip install -q uv
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e ".[test]" "torch==2.13.0"

server/create_server_env.sh "$root/.venv-server"

export VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON="$root/.venv-server/bin/python"
# Tests must never touch the user's real launcher config or data.
export VLLM_OMNI_LAUNCHER_CONFIG="$root/.pytest_cache/no-config.json"
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider "${@:-tests}"
rc=$?
set -e
# pytest exit 5 means no test ran: that is a failure here.
exit $rc
