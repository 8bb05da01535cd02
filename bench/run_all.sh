#!/usr/bin/env bash
# Reproduce the README's benchmark table with one command (CPU; stub server for the server benches).
# Uses the environments tests/run.sh creates. Results: bench/out/*.json and bench/out/table.md.
set -euo pipefail
cd "$(dirname "$0")/.."
export VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON="$(pwd)/.venv-server/bin/python"
py=.venv/bin/python
$py bench/decode_bench.py
$py bench/detect_bench.py
$py bench/ready_bench.py
$py bench/warm_bench.py
$py bench/table.py | tee bench/out/table.md
