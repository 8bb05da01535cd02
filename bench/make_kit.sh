#!/usr/bin/env bash
# Build the GPU-session kit here (a machine with a package registry) for bench/gpu_session.sh.
#
# The device (one H200, python 3.12 + torch 2.11 cu130, no registry, no network) lacks vLLM /
# vLLM-Omni and a few of ComfyUI's requirements, and files reach it only in pieces of at most
# 64 MiB per call. This script collects, into .kit/build/ (ignored by git):
#   wheels/         the server kit: the 48 wheels of GPU_KIT/requirements-kit.txt (vllm 0.26.0 +
#                   vllm-omni 0.26.0, the pair that pins torch 2.11; `av` for our package is among them)
#   comfy-wheels/   ComfyUI 0.3.64 requirements the image lacks and that are fatal at start or
#                   needed by the nodes our templates use (torchsde+trampoline for comfy.k_diffusion,
#                   alembic+SQLAlchemy+greenlet+Mako for the database layer). The front-end,
#                   templates and docs packages are NOT carried: ComfyUI runs with --front-end-root
#                   pointing at an empty folder (no front end is needed for API prompts);
#                   kornia and spandrel only guard optional nodes (an import warning, not fatal).
#   comfyui/        the ComfyUI source (COMFYUI_SRC, without .git)
#   gpu-kit/        make_fullsize_ti2v.py, make_tiny_wan.py and the tiny models
# then tars them and splits the tar into .kit/p00, .kit/p01, ... of PIECE_BYTES each (bench/gpu/kit_piece.sh) and
# prints
# the count. Environment: GPU_KIT (required: the GPU kit folder, holding make_fullsize_ti2v.py,
# make_tiny_wan.py, requirements-kit.txt and models/), COMFYUI_SRC (default /work/comfyui-src),
# PIP (a pip able to download; default: python3 -m pip).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
. "$REPO/bench/gpu/kit_piece.sh"      # PIECE_BYTES
GPU_KIT="${GPU_KIT:?set GPU_KIT to the GPU kit folder (make_fullsize_ti2v.py, requirements-kit.txt, models/)}"
COMFYUI_SRC="${COMFYUI_SRC:-/work/comfyui-src}"
PIP="${PIP:-python3 -m pip}"
KIT="$REPO/.kit"
BUILD="$KIT/build"
# Platform tags of the device image (manylinux x86_64, glibc >= 2.28), as the GPU kit's README says.
PLATFORMS=(--python-version 3.12 --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_26_x86_64
  --platform manylinux_2_24_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)
# Pinned to the versions seen working with ComfyUI 0.3.64 in the CPU rehearsal environment.
COMFY_EXTRA=(torchsde==0.2.6 trampoline==0.1.2 alembic==1.20.1 SQLAlchemy==2.1.9 greenlet==3.5.6
  Mako==1.4.3 MarkupSafe==3.0.4)

mkdir -p "$BUILD/wheels" "$BUILD/comfy-wheels"
n_kit=$(grep -c '==' "$GPU_KIT/requirements-kit.txt")
if [ "$(ls "$BUILD/wheels" | grep -c '\.whl$' || true)" -lt "$n_kit" ]; then
  $PIP download -q --no-deps --only-binary=:all: "${PLATFORMS[@]}" -d "$BUILD/wheels" \
    -r "$GPU_KIT/requirements-kit.txt"
fi
$PIP download -q --no-deps --only-binary=:all: "${PLATFORMS[@]}" -d "$BUILD/comfy-wheels" "${COMFY_EXTRA[@]}"

rm -rf "$BUILD/comfyui" "$BUILD/gpu-kit"
mkdir -p "$BUILD/comfyui" "$BUILD/gpu-kit"
tar -C "$COMFYUI_SRC" --exclude=.git --exclude=__pycache__ -cf - . | tar -C "$BUILD/comfyui" -xf -
cp "$GPU_KIT/make_fullsize_ti2v.py" "$GPU_KIT/make_tiny_wan.py" "$BUILD/gpu-kit/"
cp -r "$GPU_KIT/models" "$BUILD/gpu-kit/models"
chmod -R u+w "$BUILD/gpu-kit" "$BUILD/comfyui"

rm -f "$KIT"/p[0-9][0-9]
tar -C "$BUILD" -cf - wheels comfy-wheels comfyui gpu-kit | split -b "$PIECE_BYTES" -d -a 2 - "$KIT/p"
n=$(ls "$KIT"/p[0-9][0-9] | wc -l)
echo "kit: $(ls "$BUILD/wheels" | grep -c '\.whl$') server wheels, $(ls "$BUILD/comfy-wheels" | wc -l) ComfyUI wheels;" \
  "$n pieces: $(cd "$KIT" && ls p[0-9][0-9] | tr '\n' ' ')($(du -ch "$KIT"/p[0-9][0-9] | tail -1 | cut -f1))"
echo "PIECES=$n"
