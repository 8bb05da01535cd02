#!/usr/bin/env bash
# The CPU rehearsal of a device session's head-to-head, at tiny sizes, from the repository root:
#   FAMILY=t2v-a14b KIT_MODELS=<the GPU kit>/models bash bench/gpu/rehearse.sh [WORK]      (WORK default /tmp/rehearse-$FAMILY)
# The same phases the device runs (manifest --tiny, weights, detect, native per side and variant in the
# device calls' split, report) against a real ComfyUI 0.3.64 --cpu (COMFYUI_SRC, its venv COMFY_PY) and the
# stub server (tests/contract/stub_vllm_serve.py under the server venv SERVER_PY). ComfyUI builds UMT5-XXL
# from its own umt5_config_xxl.json, so the rehearsal runs a copy of ComfyUI whose config has the tiny
# stand-in's sizes (weights.TINY_UMT5). Its own GPU-lock folder: other launcher processes on this box
# never block it. Exit status: 0 when every phase ran and every run of every side succeeded.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
FAMILY="${FAMILY:-t2v-a14b}"
W="${1:-/tmp/rehearse-$FAMILY}"
COMFYUI_SRC="${COMFYUI_SRC:-/work/comfyui-src}"; COMFY_PY="${COMFY_PY:-/work/comfyui-venv/bin/python}"
SERVER_PY="${SERVER_PY:-$REPO/.venv-server/bin/python}"
KIT_MODELS="${KIT_MODELS:?the GPU kit's small model folders (tiny-wan22-*), as kit.sh's GPU_KIT/models}"
cd "$REPO"
rm -rf "$W"; mkdir -p "$W/comfyui" "$W/shm"
tar -C "$COMFYUI_SRC" --exclude=.git --exclude=__pycache__ -cf - . | tar -C "$W/comfyui" -xf -
"$COMFY_PY" - "$W/comfyui/comfy/text_encoders/umt5_config_xxl.json" <<'PY'
import json, sys
from bench.gpu.weights import TINY_UMT5
cfg = json.load(open(sys.argv[1])); cfg.update(TINY_UMT5); json.dump(cfg, open(sys.argv[1], "w"), indent=1)
PY
tiny="$KIT_MODELS/$("$COMFY_PY" -c "from bench.gpu.families import family; print(family('$FAMILY').kit_folder)")"
"$SERVER_PY" -m bench.gpu manifest --family "$FAMILY" --tiny --side diffusers --source "$tiny" --out "$W/manifest.json"
"$COMFY_PY" -m bench.gpu manifest --family "$FAMILY" --tiny --side comfy --source "$W/comfyui" --out "$W/manifest.json"
"$COMFY_PY" -m bench.gpu weights --family "$FAMILY" --manifest "$W/manifest.json" --base "$W/base" --shm "$W/shm" \
  --reserve-gib 1
"$COMFY_PY" -m bench.gpu detect --family "$FAMILY" --base "$W/base" --comfy-dir "$W/comfyui" --cpu --out "$W/detect.json"
printf '{"server_command": ["%s", "%s"], "startup_timeout_s": 300, "gpu_lock_dir": "%s"}\n' \
  "$SERVER_PY" "$REPO/tests/contract/stub_vllm_serve.py" "$W/gpu-locks" > "$W/launcher-config.json"
printf '{"VLLM_OMNI_LAUNCHER_CONFIG": "%s", "VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB": "141"}\n' \
  "$W/launcher-config.json" > "$W/launcher-env.json"
native() {   # one device call's native invocation: OUT_NAME then its own options
  local out="$1"; shift
  "$COMFY_PY" -m bench.gpu native --family "$FAMILY" --cpu --comfy-dir "$W/comfyui" --python "$COMFY_PY" \
    --base "$W/base" --launcher-env "$W/launcher-env.json" --detect "$W/detect.json" --out "$W/out/$out" \
    --width 64 --height 64 --frames 5 --step-guess-s 0.2 --first-s 30 "$@"
}
# The device calls of /work/notes/A14B-DEVICE.md, in their order, at tiny sizes.
native ours-default --sides ours --ours-variants auto --steps 4 --more-steps 4,20 --tag a- --deadline-s 540
native native-default --sides native --native-variants default --steps 4 --more-steps 4,20 --tag b- --deadline-s 540
native ours-fast --sides ours --ours-variants auto_fast --steps 4 --more-steps 20 --tag c- \
  --psnr-reference a-ours-auto --deadline-s 300
native native-fast --sides native --native-variants default --comfy-arg=--fast --steps 4 --more-steps 20 --tag d- \
  --psnr-reference b-native-default --deadline-s 280
"$COMFY_PY" -m bench.gpu report "$W/out" > "$W/report.md"
cat "$W/report.md"
"$COMFY_PY" - "$W/out" <<'PY'
import json, pathlib, sys
bad = [f"{p.parent.name}: {r['run']} {r.get('status')}" for p in pathlib.Path(sys.argv[1]).rglob("report.json")
       for r in json.loads(p.read_text())["runs"] if r.get("status") != "success"]
errs = [f"{p.parent.name}: {json.loads(p.read_text()).get('error')}" for p in pathlib.Path(sys.argv[1]).rglob("report.json")
        if json.loads(p.read_text()).get("error")]
print("REHEARSAL", "FAILED: " + "; ".join(bad + errs) if bad or errs else "OK")
sys.exit(1 if bad or errs else 0)
PY
