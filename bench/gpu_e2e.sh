#!/usr/bin/env bash
# Run bench/gpu_e2e.py on a 2-GPU H200 machine that has PyTorch but no package registry.
# The GPU kit (48 wheels + tiny random-weight Wan2.2 models, brought by the operator; see
# docs/upstream-facts.md, "The GPU kit") arrives in pieces of
# <= 58 MB, one per device call, moved to $KIT/pieces; this script assembles and installs it
# once, then runs the driver. Environment: KIT (default /scratch/kit), OUT (report folder).
#
#   piece calls:  mkdir -p /scratch/kit/pieces && mv .kit/p/part_NN /scratch/kit/pieces/
#   final call:   bash bench/gpu_e2e.sh
set -euo pipefail
KIT="${KIT:-/scratch/kit}"
OUT="${OUT:-/tmp/gpu-e2e-out}"
SITE="$KIT/site"
mkdir -p "$OUT"
if [ ! -d "$SITE/vllm_omni" ]; then
  (cd "$KIT" && cat pieces/part_* | tar x)
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$KIT"/wheels/*.whl
fi
export PYTHONPATH="$SITE"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv
python3 bench/gpu_e2e.py --models "$KIT/models" --out "$OUT/gpu_e2e.json" "$@"
