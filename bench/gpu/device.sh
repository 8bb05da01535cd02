#!/usr/bin/env bash
# The device side of `python -m bench.gpu` (one H200, python 3.12 + torch 2.11 image, no registry).
# Each step is one `run` call from the repository root; state lives under $KIT (default $HOME/gpukit).
#
#   bash bench/gpu/device.sh first N     the machine and image; piece 00 stashed; the random weights of both
#                                        sides built in the background (image python: torch + safetensors), of
#                                        the family FAMILY names (ti2v-5b, the default, or t2v-a14b: its ComfyUI
#                                        fp8 file in /dev/shm); later steps read the family from $KIT/family
#   bash bench/gpu/device.sh weights     the weights job again (FAMILY, SHM_DIR=<folder>, RESERVE_GIB=<n>)
#   bash bench/gpu/device.sh receive NN  stash the carried piece .kit/pNN
#   bash bench/gpu/device.sh setup N     N pieces -> server venv (vllm 0.30 + vllm-omni 0.30 on torch 2.13, as
#                                        the GPU kit's setup does it) + ComfyUI venv (image torch) + the
#                                        weights finished + ComfyUI's detection of each file
#   bash bench/gpu/device.sh native ...  the head-to-head (python -m bench.gpu native ... under ComfyUI's python)
#   bash bench/gpu/device.sh levers ...  our speed levers (python -m bench.gpu levers ... under the server venv)
#   bash bench/gpu/device.sh calibrate . the calibration (python -m bench.gpu calibrate ... under the server venv)
#   bash bench/gpu/device.sh pack        the server and ComfyUI logs into $OUT/logs.tgz (8 files come back)
# Issue 30's pipelines (bench/results/gpu-wan-pipelines-plan/README.md): `NO_WEIGHTS=1 ... first N` starts no
# head-to-head weights (setup then skips their wait and detection), and per pipeline P:
#   bash bench/gpu/device.sh pweights P  its random weights (foreground; the 14B ones ~45 GiB: one at a time)
#   bash bench/gpu/device.sh pipeline P ARGS  python -m bench.gpu pipeline --pipeline P ... (ComfyUI's python)
#   bash bench/gpu/device.sh pclean P [--shared]  delete its weights (--shared: the shared UMT5 too)
# Issue 25's GPU remainder (bench/results/gpu-issue25-next-plan/README.md): the 0.26 kit (.kit/qNN, built by
# bench/gpu/kit26.sh) and the overhead / fused LoRA / 0.26 memory steps of bench/gpu/issue25.sh:
#   bash bench/gpu/device.sh issue25 STEP ARGS   (receive26 NN, setup26 N, cli-first S, cli S, node S, overhead, fused S,
#                                                mem26 S)
# Built here by bench/gpu/kit.sh. Keep NVLink multicast off everywhere (NCCL/PyTorch/NVSHMEM variables).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
KIT="${KIT:-$HOME/gpukit}"; OUT="${OUT:-/tmp/gpu-out}"
IMAGE_PY="${IMAGE_PY:-/opt/torch/.venv/bin/python3}"
IMG="$("$IMAGE_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null)"
SENV="$KIT/server-env"; CENV="$KIT/comfy-env"; BASE="$KIT/base"; X="$KIT/x"
mkdir -p "$KIT/pieces" "$OUT" "$BASE"
# The package pinned for the whole run (.kit/snap.tgz, carried with piece 00: a copy of the tree taken when it
# passed the CPU rehearsal), so edits other helpers make to the checkout meanwhile never reach a device call;
# bench/ itself comes from the checkout each call carries.
[ -d "$KIT/snap" ] && export VLLM_OMNI_LAUNCHER_PKG="$KIT/snap"
stamp() { echo "[$(date +%T) +${SECONDS}s] $*"; }
# The model family of this machine's weights: FAMILY on `first`, remembered for the later calls.
FAMILY="${FAMILY:-$(cat "$KIT/family" 2>/dev/null || echo ti2v-5b)}"
MODEL_DIR="$BASE/models/diffusers/$FAMILY-fullsize"
RESERVE_GIB="${RESERVE_GIB:-10}"   # disk left for what arrives after `first`: kit pieces, unpacked kit, venvs
SHM_DIR="${SHM_DIR:-/dev/shm}"      # where a family's in-memory files go (T2V-A14B: ComfyUI's fp8 file)

stash() {   # NN: the full kit's .kit/pNN; nNN: the ComfyUI-only kit's .kit/npNN (kit.sh NATIVE_ONLY=1)
  local src="$REPO/.kit/p$1"; [ "${1#n}" != "$1" ] && src="$REPO/.kit/np${1#n}"
  mv "$src" "$KIT/pieces/p${1#n}" && stamp "piece $1 stashed ($(ls "$KIT/pieces" | wc -l) here)"
}

site_of() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

link_image_nvidia() {   # the image's nvidia/* libraries where the venv has none (file by file in shared folders)
  "$SENV/bin/python" - "$IMG/nvidia" "$(site_of "$SENV")/nvidia" <<'PY'
import os, sys
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
def merge(s, d):
    for name in sorted(os.listdir(s)):
        sp, dp = os.path.join(s, name), os.path.join(d, name)
        if name == "__pycache__":
            continue
        if not os.path.lexists(dp):
            os.symlink(sp, dp)
        elif os.path.isdir(dp) and not os.path.islink(dp) and os.path.isdir(sp):
            merge(sp, dp)
merge(src, dst)
PY
}

start_weights() {   # the random weights of $FAMILY, in the background (image python)
  echo "$FAMILY" > "$KIT/family"
  (cd "$REPO" && setsid nohup "$IMAGE_PY" -m bench.gpu weights --family "$FAMILY" --base "$BASE" \
    --reserve-gib "$RESERVE_GIB" --shm "$SHM_DIR" > "$KIT/weights.log" 2>&1 < /dev/null &)
  sleep 3; stamp "weights job started ($FAMILY)"; cat "$KIT/weights.log"
}

setup() {
  local want="$1" n
  if [ ! -f "$X/.unpacked" ]; then
    n=$(ls "$KIT/pieces" | grep -c '^p[0-9]')
    [ "$n" -ge "$want" ] || { stamp "MISSING PIECES: $n of $want"; ls "$KIT/pieces"; return 3; }
    rm -rf "$X"; mkdir -p "$X"
    cat "$KIT"/pieces/p[0-9]* | tar x -C "$X" || { stamp "TAR FAILED"; return 4; }
    (cd "$X" && sha256sum -c --quiet SHA256SUMS) || { stamp "CHECKSUM FAILED"; return 5; }
    rm -f "$KIT"/pieces/p[0-9]*; touch "$X/.unpacked"; stamp "kit unpacked"
  fi
  # A ComfyUI-only kit (kit.sh with NATIVE_ONLY=1: no vllm wheel) runs the native side alone: no server venv.
  if [ ! -f "$SENV/.done" ] && ls "$X"/wheels/vllm-[0-9]*.whl > /dev/null 2>&1; then   # as `setup` makes it: --no-deps before the image .pth
    rm -rf "$SENV"; "$IMAGE_PY" -m venv "$SENV" || return 6
    "$SENV/bin/python" -m pip install -q --no-index --no-deps --no-compile "$X"/wheels/*.whl > "$KIT/pip-server.log" 2>&1 \
      || { tail -5 "$KIT/pip-server.log"; return 7; }
    echo "$IMG" > "$(site_of "$SENV")/zz_torch_image.pth"
    link_image_nvidia
    cp "$X"/gpu-kit/vol_memcap.py "$X"/gpu-kit/zz_vol_memcap.pth "$(site_of "$SENV")/"
    # vllm-omni's own per-stage timing line (text encode / denoise / decode): a module switch, off upstream
    sed -i 's/^DEBUG_PERF = False/DEBUG_PERF = True/' "$(site_of "$SENV")"/vllm_omni/diffusion/models/wan2_2/pipeline_wan2_2*.py
    # bytecode as `setup` leaves it (pip's default, uv with --compile-bytecode): the first server start then
    # times what a user's does, not Python compiling vllm / torch on import (bench/server_import_bytecode.py)
    "$SENV/bin/python" -m compileall -q -j 0 "$(site_of "$SENV")" > /dev/null 2>&1
    touch "$SENV/.done"; stamp "server venv"
  fi
  if [ ! -f "$CENV/.done" ]; then   # ComfyUI on the image's torch; what ComfyUI 0.3.64 + our pack need beyond it
    rm -rf "$CENV"; "$IMAGE_PY" -m venv "$CENV" || return 8
    "$CENV/bin/python" -m pip install -q --no-index --no-deps --no-compile "$X"/comfy-wheels/*.whl \
      "$X"/wheels/{av,pydantic,pydantic_core,pydantic_settings,annotated_types,typing_inspection,python_dotenv,torchsde,trampoline}-[0-9]*.whl \
      > "$KIT/pip-comfy.log" 2>&1 || { tail -5 "$KIT/pip-comfy.log"; return 9; }
    echo "$IMG" > "$(site_of "$CENV")/zz_image.pth"
    touch "$CENV/.done"; stamp "ComfyUI venv"
  fi
  printf '{"extra_env": {"HF_HUB_OFFLINE": "1", "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}, "startup_timeout_s": 900}\n' > "$KIT/launcher-config.json"
  printf '{"VLLM_OMNI_LAUNCHER_SERVER_ENV": "%s", "VLLM_OMNI_LAUNCHER_CONFIG": "%s"}\n' "$SENV" "$KIT/launcher-config.json" > "$KIT/launcher-env.json"
  "$SENV/bin/python" -c 'import torch, vllm, vllm_omni; print("ENV server torch", torch.__version__, torch.cuda.is_available(), "vllm", vllm.__version__, "vllm-omni", vllm_omni.__version__)' 2>&1 | grep -v -E "^(INFO|WARNING|DEBUG)" | tail -3
  "$CENV/bin/python" -c 'import torch, av, alembic, sqlalchemy, torchsde, pydantic; print("ENV comfy torch", torch.__version__, "av", av.__version__)' 2>&1 | tail -2
  if [ -f "$KIT/no-weights" ]; then stamp "setup done (no head-to-head weights: pipelines)"; return 0; fi
  local t=0
  while [ ! -f "$MODEL_DIR/.built" ]; do
    if ! pgrep -f "bench.gpu weights" > /dev/null; then stamp "WEIGHTS JOB GONE"; tail -20 "$KIT/weights.log"; return 10; fi
    sleep 2; t=$((t + 2)); [ $t -gt 400 ] && { stamp "WEIGHTS NOT DONE"; tail -5 "$KIT/weights.log"; return 11; }
  done
  tail -8 "$KIT/weights.log"; df -h "$KIT" /dev/shm | tail -2
  (cd "$REPO" && "$CENV/bin/python" -m bench.gpu detect --family "$FAMILY" --base "$BASE" --comfy-dir "$X/comfyui" --out "$KIT/detect.json" 2>&1 | grep -E "^DETECT|Error|error" | tail -3)
  cp "$KIT/detect.json" "$OUT/" 2>/dev/null
  stamp "setup done"
}

case "${1:?first N | weights | receive NN | setup N | native ARGS | levers ARGS | calibrate ARGS | pweights P | pipeline P ARGS | pclean P | pack}" in
  first)
    stamp "machine"; nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
    uname -r; nproc; free -g | head -2; df -h "$HOME" /tmp /dev/shm | tail -3; "$IMAGE_PY" --version
    "$IMAGE_PY" -m pip list 2>/dev/null | grep -i -E "^(torch|safetensors|psutil|nvidia-ml-py|markupsafe|aiohttp|av|pydantic|transformers|sentencepiece) " | tr '\n' ';'; echo
    stash 00
    [ -f "$REPO/.kit/snap.tgz" ] && tar xzf "$REPO/.kit/snap.tgz" -C "$KIT" && export VLLM_OMNI_LAUNCHER_PKG="$KIT/snap" \
      && stamp "package pinned: $(find "$KIT/snap" -name '*.py' | wc -l) files"
    if [ -n "${NO_WEIGHTS:-}" ]; then touch "$KIT/no-weights"; stamp "no head-to-head weights"; else start_weights; fi ;;
  weights) start_weights ;;   # again, e.g. with SHM_DIR / RESERVE_GIB changed after `first` said no room
  receive) stash "${2:?NN}"; tail -2 "$KIT/weights.log" ;;
  setup) setup "${2:?N pieces}" ;;
  native) shift; cd "$REPO" && "$CENV/bin/python" -m bench.gpu native --comfy-dir "$X/comfyui" --python "$CENV/bin/python" \
      --base "$BASE" --launcher-env "$KIT/launcher-env.json" --detect "$KIT/detect.json" --family "$FAMILY" "$@" ;;
  levers) shift; cd "$REPO" && "$SENV/bin/python" -m bench.gpu levers --model "$MODEL_DIR" \
      --data-dir "$KIT/lev-data" --reference "$KIT/lev-reference.npz" "$@" ;;
  calibrate) shift; cd "$REPO" && "$SENV/bin/python" -m bench.gpu calibrate --model "$MODEL_DIR" \
      --data-dir "$KIT/cal-data" "$@" ;;
  pweights) (cd "$REPO" && "$IMAGE_PY" -m bench.gpu pipeline-weights --pipeline "${2:?pipeline}" --base "$BASE" \
      --reserve-gib "${RESERVE_GIB_PIPELINE:-1}" 2>&1 | tee -a "$KIT/weights.log" | grep -E "^PIPELINE-WEIGHTS|weights:|Error|error")
    df -h "$KIT" | tail -1 ;;
  pipeline) p="${2:?pipeline}"; shift 2; cd "$REPO" && "$CENV/bin/python" -m bench.gpu pipeline --pipeline "$p" \
      --comfy-dir "$X/comfyui" --python "$CENV/bin/python" --base "$BASE" --launcher-env "$KIT/launcher-env.json" "$@" ;;
  pclean) (cd "$REPO" && "$IMAGE_PY" -m bench.gpu pipeline-weights --pipeline "${2:?pipeline}" --base "$BASE" --remove \
      ${3:-}); df -h "$KIT" | tail -1 ;;
  issue25) shift; . "$REPO/bench/gpu/issue25.sh" "$@" ;;
  pack)   # one tarball of logs: a call returns at most 8 files
    tar czf "$OUT/logs.tgz" -C "$KIT" --ignore-failed-read weights.log pip-server.log pip-comfy.log \
      $(cd "$KIT" && ls -d base/launcher-data/logs base/comfyui.log cal-data/logs lev-logs 2>/dev/null) 2>/dev/null; ls -la "$OUT" ;;
  *) echo "unknown step $1" >&2; exit 2 ;;
esac
