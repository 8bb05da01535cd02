#!/usr/bin/env bash
# The CPU rehearsal of a device session's head-to-head, at tiny sizes, from the repository root:
#   FAMILY=t2v-a14b KIT_MODELS=<the GPU kit>/models bash bench/gpu/rehearse.sh [WORK]      (WORK default /tmp/rehearse-$FAMILY)
# The same phases the device runs (manifest --tiny, weights, detect, native per side and variant in the
# device calls' split, report) against a real ComfyUI 0.3.64 --cpu (COMFYUI_SRC, its venv COMFY_PY) and the
# stub server (tests/contract/stub_vllm_serve.py under the server venv SERVER_PY). ComfyUI builds UMT5-XXL
# from its own umt5_config_xxl.json, so the rehearsal runs a copy of ComfyUI whose config has the tiny
# stand-in's sizes (weights.TINY_UMT5). Its own GPU-lock folder: other launcher processes on this box
# never block it. A family with distill LoRAs (T2V-A14B) also checks the random LoRA file against ComfyUI's key
# map and diffusers' Wan converter (what vLLM-Omni 0.30 fuses with), and runs the 4-step LoRA pair. Exit status:
# 0 when every phase ran and every run of every side succeeded with its frames (PNG sample and frame count).
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
LORAS="$("$COMFY_PY" -c "from bench.gpu.families import family; print(len(family('$FAMILY').loras))")"
if [ "$LORAS" != 0 ]; then
  # ComfyUI's own LoRA key map of the model it loads (LoraLoaderModelOnly's path): every down/up pair patches a
  # weight of its shape.
  "$COMFY_PY" - "$W/comfyui" "$W/base/models" "$FAMILY" <<'PY'
import sys
comfy_dir, models, name = sys.argv[1:4]
sys.path.insert(0, comfy_dir)
sys.argv = [sys.argv[0], "--cpu"]
import comfy.options
comfy.options.enable_args_parsing()
import comfy.lora, comfy.lora_convert, comfy.sd, comfy.utils
from bench.gpu.families import family
fam = family(name)
patcher = comfy.sd.load_diffusion_model(f"{models}/diffusion_models/{fam.files['unet'][1]}")
weights = patcher.model.state_dict()
for lora_name in fam.loras:
    lora = comfy.utils.load_torch_file(f"{models}/loras/{lora_name}")
    patches = comfy.lora.load_lora(comfy.lora_convert.convert_lora(lora),
                                   comfy.lora.model_lora_keys_unet(patcher.model, {}))
    pairs = sum(k.endswith(".lora_down.weight") for k in lora)
    shapes = [(k, (p.weights[0].shape[0], p.weights[1].shape[1]), tuple(weights[k].shape)) for k, p in patches.items()]
    bad = [s for s in shapes if s[1] != s[2]]
    assert pairs and len(patches) == pairs and not bad, (lora_name, len(patches), pairs, bad[:3])
    print(f"LORA {lora_name}: ComfyUI patches {len(patches)} weights")
PY
  # diffusers' Wan converter, which vLLM-Omni 0.30's fused startup loader runs on a ComfyUI-format file.
  "$SERVER_PY" - "$W/base/models/loras" "$FAMILY" <<'PY'
import sys
from diffusers.loaders.lora_conversion_utils import _convert_non_diffusers_wan_lora_to_diffusers
from safetensors.torch import load_file
from bench.gpu.families import family
for lora_name in family(sys.argv[2]).loras:
    sd = load_file(f"{sys.argv[1]}/{lora_name}")
    out = _convert_non_diffusers_wan_lora_to_diffusers(dict(sd))
    pairs = sum(k.endswith(".lora_down.weight") for k in sd)
    assert len(out) == 2 * pairs and all(k.startswith("transformer.blocks.") for k in out), (lora_name, len(out))
    print(f"LORA {lora_name}: diffusers' Wan converter maps {len(out)} tensors")
PY
fi
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
if [ "$LORAS" != 0 ]; then   # the 4-step LoRA pair (the template's enabled group), as its device calls
  native ours-lora4 --sides ours --ours-variants lightx2v_4step --steps 4 --more-steps 4 --tag e- --deadline-s 400
  native native-lora4 --sides native --native-variants lightx2v_4step --steps 4 --more-steps 4 --tag f- \
    --deadline-s 300
fi
"$COMFY_PY" -m bench.gpu report "$W/out" > "$W/report.md"
cat "$W/report.md"
"$COMFY_PY" - "$W/out" "$W/base" <<'PY'
import json, pathlib, sys
bad = [f"{p.parent.name}: {r['run']} {r.get('status')}" for p in pathlib.Path(sys.argv[1]).rglob("report.json")
       for r in json.loads(p.read_text())["runs"] if r.get("status") != "success"]
for p in pathlib.Path(sys.argv[1]).rglob("report.json"):     # every run's frames: its count and PNG sample
    rep = json.loads(p.read_text())
    for r in rep["runs"]:
        pngs = list((pathlib.Path(sys.argv[2]) / "output/bench").glob(f"{rep['args']['tag']}{r['side']}-{r['run']}_*.png"))
        if r.get("sink", {}).get("batch") != rep["args"]["frames"] or not pngs:
            bad.append(f"{p.parent.name}: {r['run']} frames {r.get('sink')}, {len(pngs)} PNG")
log = (pathlib.Path(sys.argv[2]) / "comfyui.log").read_text(errors="replace")
bad += [line for line in log.splitlines() if "lora key not loaded" in line][:3]
errs = [f"{p.parent.name}: {json.loads(p.read_text()).get('error')}" for p in pathlib.Path(sys.argv[1]).rglob("report.json")
        if json.loads(p.read_text()).get("error")]
print("REHEARSAL", "FAILED: " + "; ".join(bad + errs) if bad or errs else "OK")
sys.exit(1 if bad or errs else 0)
PY
