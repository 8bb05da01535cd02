#!/usr/bin/env bash
# The CPU rehearsal of the issue-30 pipeline calls (bench/results/gpu-wan-pipelines-plan/README.md), at tiny sizes,
# from the repository root:
#   KIT_MODELS=<the GPU kit>/models bash bench/gpu/rehearse_pipelines.sh [WORK]      (WORK default /tmp/rehearse-pipelines)
# PIPELINES="vace-14b s2v-14b" picks some (default: all four). Per pipeline, the device's phases in their order:
# pipeline-manifest --tiny (server venv: the same upstream classes and converter checks as the committed
# manifests, 2-layer sizes), pipeline-weights (ComfyUI's python: the repo's layout, the shared UMT5 hard-linked),
# pipeline (a real ComfyUI 0.3.64 --cpu running our template; Local Server launches the stub server,
# tests/contract/stub_vllm_serve.py: vLLM-Omni 0.30's real API server, request parsing and pipeline
# pre-processing with a fake GPU) for the first, warm and held-out jobs, then pipeline-weights --remove as
# the device frees disk between 14B pipelines. Each tiny folder is also loaded the way vLLM-Omni 0.30's
# pipeline loads it, on CPU, offline (pipeline_load_check.py: tokenizer, text encoder, VAE, S2V's wav2vec2, and the
# transformer's own load_weights taking every tensor of the files and filling every parameter). Exit status 0
# when every folder loaded and every job of every pipeline succeeded with its frames (PNG sample, count).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
W="${1:-/tmp/rehearse-pipelines}"
COMFYUI_SRC="${COMFYUI_SRC:-/work/comfyui-src}"; COMFY_PY="${COMFY_PY:-/work/comfyui-venv/bin/python}"
SERVER_PY="${SERVER_PY:-$REPO/.venv-server/bin/python}"
KIT_MODELS="${KIT_MODELS:?the small model folders of the GPU kit (tiny-wan22-ti2v/tokenizer is read)}"
PIPELINES="${PIPELINES:-vace-14b vace-1.3b s2v-14b fastwan-ti2v-5b}"
cd "$REPO"
rm -rf "$W"; mkdir -p "$W/comfyui" "$W/out"
tar -C "$COMFYUI_SRC" --exclude=.git --exclude=__pycache__ -cf - . | tar -C "$W/comfyui" -xf -
printf '{"server_command": ["%s", "%s"], "startup_timeout_s": 300, "gpu_lock_dir": "%s"}\n' \
  "$SERVER_PY" "$REPO/tests/contract/stub_vllm_serve.py" "$W/gpu-locks" > "$W/launcher-config.json"
printf '{"VLLM_OMNI_LAUNCHER_CONFIG": "%s", "VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB": "141"}\n' \
  "$W/launcher-config.json" > "$W/launcher-env.json"
shapes() {   # the shapes at rehearsal size (S2V: frames per clip, at least 48: the 3 s of audio in one clip)
  case "$1" in s2v-14b) echo "--shape 128x64x48 --held-out 160x96x52" ;; *) echo "--shape 128x64x9 --held-out 160x96x13" ;; esac
}
for p in $PIPELINES; do
  "$SERVER_PY" -m bench.gpu pipeline-manifest --pipeline "$p" --tiny --tokenizer "$KIT_MODELS/tiny-wan22-ti2v/tokenizer" \
    --out "$W/manifest-$p.json" 2>&1 | grep -v -E "^(INFO|WARNING|DEBUG)|cpp_extension" || true
  "$COMFY_PY" -m bench.gpu pipeline-weights --pipeline "$p" --manifest "$W/manifest-$p.json" --base "$W/base" --reserve-gib 1
  HF_HUB_OFFLINE=1 HF_HOME="$W/base/hf-home" "$SERVER_PY" -m bench.gpu.pipeline_load_check \
    "$W/base/models/diffusers/$p-fullsize" > "$W/load-$p.log" 2>&1 || true
  grep -E "^LOAD|Error" "$W/load-$p.log" || true
  "$COMFY_PY" -m bench.gpu pipeline --pipeline "$p" --cpu --comfy-dir "$W/comfyui" --python "$COMFY_PY" \
    --base "$W/base" --launcher-env "$W/launcher-env.json" --out "$W/out/$p" $(shapes "$p") --steps 2 --step-guess-s 0.2 --first-s 60 --tag r- --deadline-s 400 || true
  "$COMFY_PY" -m bench.gpu pipeline-weights --pipeline "$p" --base "$W/base" --remove
done
"$COMFY_PY" - "$W/out" "$W/base" "$W" <<'PY'
import json, pathlib, sys
out, base, work = (pathlib.Path(a) for a in sys.argv[1:4])
bad = []
for log in sorted(work.glob("load-*.log")):
    line = next((x for x in log.read_text(errors="replace").splitlines() if x.startswith("LOAD ")), None)
    if line is None or not json.loads(line[5:])["transformer"]["loaded_all"]:
        bad.append(f"{log.stem}: {line or log.read_text(errors='replace')[-1500:]}")
for p in sorted(out.glob("*/report.json")):
    rep = json.loads(p.read_text())
    bad += [f"{rep['pipeline']}: {e}" for e in rep.get("errors", []) + rep.get("skipped", [])]
    if rep.get("error"):
        bad.append(f"{rep['pipeline']}: {rep['error']}")
    if len(rep["runs"]) != 3:
        bad.append(f"{rep['pipeline']}: {len(rep['runs'])} jobs ran, not 3")
    for r in rep["runs"]:
        pngs = list((base / "output/bench").glob(f"r-{rep['pipeline']}-{r['run']}_*.png"))
        got = (r.get("sink") or {}).get("batch")
        # the stub returns the frames asked for; S2V's real pipeline drops 3 of its first clip (frames_expected)
        ok = got in (r["frames_expected"], r["shape"][2])
        print(f"{rep['pipeline']:16s} {r['run']:8s} {r['status']} {r['shape']} frames {got} "
              f"(expected {r['frames_expected']}) {len(pngs)} PNG, planner {r.get('planner_peak_gib')} GiB "
              f"{r.get('planner_error', '')} s/step {r.get('s_per_step')}")
        if r.get("status") != "success" or not ok or not pngs or r.get("planner_peak_gib") is None:
            bad.append(f"{rep['pipeline']} {r['run']}: {r.get('status')} frames {got} {len(pngs)} PNG "
                       f"{r.get('planner_error', '')} {json.dumps(r.get('error'))[:1500]}")
print("REHEARSAL", "FAILED: " + "; ".join(bad) if bad else "OK")
sys.exit(1 if bad else 0)
PY
