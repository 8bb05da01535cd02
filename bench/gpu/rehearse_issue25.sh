#!/usr/bin/env bash
# The CPU rehearsal of issue 25's device calls (bench/results/gpu-issue25-next-plan/README.md), at tiny sizes, from
# the repository root:   KIT_MODELS=<kit>/models bash bench/gpu/rehearse_issue25.sh [WORK] (WORK default /tmp/rehearse-issue25)
# WORK is laid out as the device's $KIT, the venvs standing in: comfy-env is ComfyUI's venv (COMFY_PY), server-env
# the server venv (SERVER_PY); the tiny TI2V-5B stand-in's weights and ComfyUI's detection are built as
# bench/gpu/rehearse.sh builds them, and every step of bench/gpu/issue25.sh then runs through device.sh against
# the stub server (tests/contract/stub_vllm_serve.py) and a real ComfyUI 0.3.64 --cpu: setup26 on the real 0.26
# pieces (.kit/qNN, copied as receive26 leaves them; with KIT26=0 skipped) with the server venv's python as the
# image's, cli-first, cli, node, overhead, fused (the GPU kit's tiny T2V-A14B, KIT_MODELS), mem26. Exit status 0
# when every step ran, every job and run succeeded and each verdict file has its line (on CPU the overhead verdict
# is the stub's, which says nothing of a GPU, and the 0.26 memory verdict "none": no NVML).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
W="${1:-/tmp/rehearse-issue25}"
COMFYUI_SRC="${COMFYUI_SRC:-/work/comfyui-src}"; COMFY_PY="${COMFY_PY:-/work/comfyui-venv/bin/python}"
SERVER_PY="${SERVER_PY:-$REPO/.venv-server/bin/python}"
KIT_MODELS="${KIT_MODELS:?the GPU kit's small model folders (tiny-wan22-*), as kit.sh's GPU_KIT/models}"
cd "$REPO"
rm -rf "$W"; mkdir -p "$W/x/comfyui" "$W/shm" "$W/pieces26"
ln -s "$(dirname "$(dirname "$COMFY_PY")")" "$W/comfy-env"
ln -s "$(dirname "$(dirname "$SERVER_PY")")" "$W/server-env"
tar -C "$COMFYUI_SRC" --exclude=.git --exclude=__pycache__ -cf - . | tar -C "$W/x/comfyui" -xf -
"$COMFY_PY" - "$W/x/comfyui/comfy/text_encoders/umt5_config_xxl.json" <<'PY'
import json, sys
from bench.gpu.weights import TINY_UMT5
cfg = json.load(open(sys.argv[1])); cfg.update(TINY_UMT5); json.dump(cfg, open(sys.argv[1], "w"), indent=1)
PY
"$SERVER_PY" -m bench.gpu manifest --family ti2v-5b --tiny --side diffusers --source "$KIT_MODELS/tiny-wan22-ti2v" \
  --out "$W/manifest.json"
"$COMFY_PY" -m bench.gpu manifest --family ti2v-5b --tiny --side comfy --source "$W/x/comfyui" --out "$W/manifest.json"
"$COMFY_PY" -m bench.gpu weights --family ti2v-5b --manifest "$W/manifest.json" --base "$W/base" --shm "$W/shm" \
  --reserve-gib 1
"$COMFY_PY" -m bench.gpu detect --family ti2v-5b --base "$W/base" --comfy-dir "$W/x/comfyui" --cpu \
  --out "$W/detect.json"
echo ti2v-5b > "$W/family"
printf '{"server_command": ["%s", "%s"], "startup_timeout_s": 300, "gpu_lock_dir": "%s"}\n' \
  "$SERVER_PY" "$REPO/tests/contract/stub_vllm_serve.py" "$W/gpu-locks" > "$W/launcher-config.json"
printf '{"VLLM_OMNI_LAUNCHER_CONFIG": "%s", "VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB": "141"}\n' \
  "$W/launcher-config.json" > "$W/launcher-env.json"

export KIT="$W" OUT="$W/out" SERVER_CMD="$SERVER_PY $REPO/tests/contract/stub_vllm_serve.py" KIT_MODELS
export I25_SHAPE_ARGS="--width 64 --height 64 --frames 5" NODE_ARGS="--step-guess-s 0.2 --first-s 30"
export CLI_ARGS="--gpu-lock-dir $W/gpu-locks --ready-guess-s 20 --step-guess-s 0.2"
export VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB=141   # the CLI's planner (cli-first) on a box without a GPU
export MEM26_ARGS="--gpu-lock-dir $W/gpu-locks" MEM26_SHAPES="64x64x5,96x64x9" MEM26_JOB_GUESS_S=5 MEM26_CONFIG_MIN_S=30
step() {   # one device.sh step; its exit status is printed, the check at the end judges what it wrote
  echo "== issue25 $*"; bash bench/gpu/device.sh issue25 "$@" || echo "== issue25 $1 rc=$?"
}
if [ "${KIT26:-1}" != 0 ]; then
  cp "$REPO"/.kit/q[0-9][0-9] "$W/pieces26/"
  IMAGE_PY="$SERVER_PY" step setup26 "$(ls "$REPO"/.kit/q[0-9][0-9] | wc -l)"
fi
# mem26 under the 0.26 venv where setup26 made one (the launcher and calibrate run there on the device). What the
# stub cannot answer for 0.26, the venv can: the launcher's pre-launch version check on it, and 0.26's own `vllm
# serve` parser listing every flag calibrate's configurations give (the check below reads both files).
if [ -x "$W/server-env-26/bin/python" ]; then
  "$SERVER_PY" -c 'import sys; from bench.gpu.common import import_package; import_package()
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.launch.versions import checked_server_version
print(".".join(map(str, checked_server_version(LocalConfig(server_command=(sys.argv[1], "-c", "import vllm"))))))' \
    "$W/server-env-26/bin/python" > "$W/version-check-26.txt" 2>&1 || true
  (cd "$W" && timeout 300 "$W/server-env-26/bin/python" -c "import sys; from vllm.entrypoints.cli.main import main
sys.argv[0] = 'vllm'; sys.exit(main())" serve --omni --help=all > "$W/serve-help-26.txt" 2>&1) || true
else
  export SERVER26_PY="$SERVER_PY"
fi
step cli-first 200
step cli 300
step node 300
step overhead
CAP_FUSED=200 step fused 240
step mem26 420
"$COMFY_PY" - "$W/i25" "${KIT26:-1}" <<'PY'
import json, pathlib, re, sys
r, bad = pathlib.Path(sys.argv[1]), []
def load(name):
    try:
        return json.loads((r / name).read_text())
    except (OSError, ValueError) as exc:
        bad.append(f"{name}: {exc}")
        return {}
first = load("cli-first/report.json")
if not (first.get("timings") or {}).get("server_inference"):
    bad.append(f"cli-first: {first}")
lev = load("cli/levers.json")
jobs = [j for c in lev.get("configs", []) for j in c.get("jobs", [])]
if [j.get("via") for j in jobs] != ["client", "cli", "cli", "cli"] or not all(j.get("ok") for j in jobs):
    bad.append(f"cli: {[(j.get('via'), j.get('ok'), j.get('error') or j.get('skipped')) for j in jobs]}")
nat = load("node/report.json")
runs = [x for x in nat.get("runs", []) if x.get("side") == "ours"]
if nat.get("error") or [x.get("run") for x in runs] != ["first", "eager-4", "eager-20"] \
        or any(x.get("status") != "success" for x in runs):
    bad.append(f"node: {nat.get('error')} {[(x.get('run'), x.get('status')) for x in runs]} {nat.get('sides')}")
fused = load("fused/fused-lora.json")
served = [s for s in fused.get("servers", {}).values() if s.get("jobs") and "error" not in s]
if len(served) != 3 or not all(fused.get(k) for k in ("started_with_flags", "scaled_copies_fused", "deterministic")):
    bad.append(f"fused: {len(served)} servers, " + str({k: fused.get(k) for k in
               ("started_with_flags", "scaled_copies_fused", "deterministic", "interrupted")}))
cal = load("mem26/calibration.json")
cfgs = cal.get("configs", [])
if len(cfgs) != 4 or any(c.get("error") or c.get("skipped") or len(c.get("jobs", [])) != 2
                         or not all(j.get("ok") for j in c["jobs"]) for c in cfgs):
    bad.append("mem26: " + str([(c.get("config"), c.get("error") or c.get("skipped"), len(c.get("jobs", [])))
                                for c in cfgs]))
for name, prefix in (("verdicts/overhead-verdict.json", "OVERHEAD VERDICT: "), ("mem26/mem26-verdict.json",
                                                                             "MEM26 VERDICT: ")):
    line = load(name).get("line", "")
    print(line)
    if not line.startswith(prefix):
        bad.append(f"{name}: no verdict line")
if sys.argv[2] != "0":
    if not (r.parent / "versions26.json").is_file():
        bad.append("setup26: no versions26.json (the 0.26 venv did not import)")
    def text(name):
        path = r.parent / name
        return path.read_text(errors="replace") if path.is_file() else ""
    seen = text("version-check-26.txt").strip().splitlines()[-1:]
    if seen != ["0.26"]:
        bad.append(f"the launcher's version check on the 0.26 venv: {seen}")
    help_text = text("serve-help-26.txt")
    flags = {f for c in cfgs for f in c.get("flags", []) if f.startswith("--")}
    unknown = sorted(f for f in flags if not re.search(re.escape(f) + r"(?![\w-])", help_text))
    print(f"0.26 `vllm serve` knows {sorted(flags)}: {'all' if flags and not unknown else unknown}")
    if not flags or unknown:
        bad.append(f"flags 0.26's serve does not list: {unknown or 'none read'}")
print("REHEARSAL", "FAILED: " + "; ".join(bad) if bad else "OK")
sys.exit(1 if bad else 0)
PY
