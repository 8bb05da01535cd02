#!/usr/bin/env bash
# Build the kit for bench/gpu/device.sh here (a machine with a registry), as pieces a device call can carry.
#   GPU_KIT=<the GPU kit folder> WHEELS=<the 0.30 kit's wheels> bash bench/gpu/kit.sh
# The tar holds wheels/ (requirements-kit30.txt: vllm 0.30.0 + vllm-omni 0.30.0 on torch 2.13), comfy-wheels/
# (what ComfyUI 0.3.64 needs beyond the image: alembic, SQLAlchemy, greenlet, Mako; torchsde, trampoline, av,
# pydantic come from wheels/), comfyui/ (COMFYUI_SRC without .git), gpu-kit/ (the allocator cap, the tiny
# models) and SHA256SUMS; split into .kit/pNN of PIECE_BYTES (bench/gpu/kit_piece.sh).
# NATIVE_ONLY=1: the kit of ComfyUI's side alone (no vllm wheels: device.sh setup then builds no server venv), as
# .kit/npNN, for a native-only session (receive them with `bash bench/gpu/device.sh receive nNN`).
# Wheels are not recompressed: xz -6 of the NCCL wheel's contents saved 6% for 3.8 min of compression here.
# nvidia-nccl-cu13==2.29.7 (requirements-kit30.txt) is no longer offered by the registry (2026-12-02): download
# 2.32.3 in its place (it ran there, one GPU: no collective); apache-tvm-ffi and cryptography come as other
# manylinux builds of the same versions (hashes differ from the list's).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
GPU_KIT="${GPU_KIT:?the GPU kit folder (kit30/vol_memcap.py, models/)}"
WHEELS="${WHEELS:?folder of the 0.30 kit wheels}"
COMFY_WHEELS="${COMFY_WHEELS:?folder of alembic/SQLAlchemy/greenlet/Mako wheels}"
COMFYUI_SRC="${COMFYUI_SRC:-/work/comfyui-src}"
. "$REPO/bench/gpu/kit_piece.sh"      # PIECE_BYTES, and why that size
B="$REPO/.kit/build"
rm -rf "$B"; mkdir -p "$B/wheels" "$B/comfy-wheels" "$B/comfyui" "$B/gpu-kit"
if [ -n "${NATIVE_ONLY:-}" ]; then   # ComfyUI's side alone: only the server wheels its venv takes (device.sh setup)
  for w in av pydantic pydantic_core pydantic_settings annotated_types typing_inspection python_dotenv torchsde trampoline; do
    ln -s "$WHEELS/$w"-[0-9]*.whl "$B/wheels/"; done
else ln -s "$WHEELS"/*.whl "$B/wheels/"; fi
ln -s "$COMFY_WHEELS"/*.whl "$B/comfy-wheels/"
tar -C "$COMFYUI_SRC" --exclude=.git --exclude=__pycache__ -cf - . | tar -C "$B/comfyui" -xf -
cp "$GPU_KIT"/kit30/vol_memcap.py "$GPU_KIT"/kit30/zz_vol_memcap.pth "$B/gpu-kit/"
cp -r "$GPU_KIT/models" "$B/gpu-kit/models"; chmod -R u+w "$B"
(cd "$B" && find -L wheels comfy-wheels comfyui gpu-kit -type f -print0 | sort -z | xargs -0 sha256sum > SHA256SUMS)
P="$REPO/.kit/${NATIVE_ONLY:+n}p"     # the ComfyUI-only kit's pieces are .kit/npNN
rm -f "$P"[0-9][0-9]
tar -C "$B" -chf - SHA256SUMS gpu-kit comfy-wheels comfyui wheels | split -b "$PIECE_BYTES" -d -a 2 - "$P"
n=$(ls "$P"[0-9][0-9] | wc -l)
echo "kit: $(ls "$B/wheels" | wc -l) server wheels, $(ls "$B/comfy-wheels" | wc -l) ComfyUI wheels; $n pieces of ${PIECE_BYTES} bytes"
echo "PIECES=$n"
