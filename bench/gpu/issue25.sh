# Issue 25's GPU remainder (bench/results/gpu-issue25-next-plan/README.md), sourced by bench/gpu/device.sh as
#   bash bench/gpu/device.sh issue25 STEP ARGS
# (device.sh's variables and functions: KIT, OUT, REPO, SENV, CENV, X, MODEL_DIR, IMAGE_PY, IMG, stamp, site_of).
#   receive26 NN      stash the carried piece .kit/qNN (bench/gpu/kit26.sh: the vLLM-Omni 0.26 kit)
#   setup26 N         N pieces -> $KIT/server-env-26: vllm 0.26.0 + vllm-omni 0.26.0 on the image's torch 2.11,
#                     beside the 0.30 venv (untouched); its versions in $OUT/versions26.json
#   cli-first S       (a) the CLI process's own job: `generate --model` (0.30 venv, eager) starts a fresh server, one
#                     4-step job at 1280x704x121 (the first of its kind there), --report-json -> $OUT/cli-first/
#   cli DEADLINE_S    (a) the CLI's overhead: `levers` on 0.30, eager, a 4-step client job then CLI_JOBS (3)
#                     jobs through cli/generate_cmd._generate at 1280x704x121 -> $OUT/cli/levers.json
#   node DEADLINE_S   (a) the node's overhead: our side alone in ComfyUI (template, eager), first + warm-up + 4 +
#                     20 steps at 1280x704x121 -> $OUT/node/report.json
#   overhead          (a) the verdict of both -> $OUT/verdicts/overhead-verdict.json, "OVERHEAD VERDICT" line
#   fused DEADLINE_S  (b) bench/gpu_small_checks.sh's fused step alone, its full cap (CAP_FUSED, default 150 s):
#                     three tiny T2V-A14B servers (no LoRA, x1.0, x2.5) -> $OUT/fused/fused-lora.json + SUMMARY
#   mem26 DEADLINE_S  (c) `calibrate` on the 0.26 server at held-back shapes (MEM26_SHAPES, MEM26_CONFIGS), then
#                     the 0.26 model's verdict -> $OUT/mem26/calibration.json, mem26-verdict.json, "MEM26 VERDICT"
# SERVER_CMD (the CPU rehearsal: the stub server) replaces the real server in cli, fused and mem26 (and adds
# --cpu); I25_SHAPE_ARGS, CLI_ARGS, NODE_ARGS, MEM26_ARGS, KIT_MODELS, SERVER26_PY: the rehearsal's sizes and paths
# (bench/gpu/rehearse_issue25.sh).
SENV26="$KIT/server-env-26"; X26="$KIT/x26"
R="$KIT/i25"   # each step's report folder, copied into $OUT (a fresh folder every call) when it ends
LAUNCHER_CONFIG="$KIT/launcher-config.json"
server_arg=(); [ -n "${SERVER_CMD:-}" ] && server_arg=(--server-cmd "$SERVER_CMD")
cpu_arg=(); [ -n "${SERVER_CMD:-}" ] && cpu_arg=(--cpu)

setup26() {
  local want="$1" n
  if [ ! -f "$X26/.unpacked" ]; then
    n=$(ls "$KIT/pieces26" 2>/dev/null | grep -c '^q[0-9]')
    [ "$n" -ge "$want" ] || { stamp "MISSING 0.26 PIECES: $n of $want"; return 3; }
    rm -rf "$X26"; mkdir -p "$X26"
    cat "$KIT"/pieces26/q[0-9]* | tar x -C "$X26" || { stamp "0.26 TAR FAILED"; return 4; }
    (cd "$X26" && sha256sum -c --quiet SHA256SUMS26) || { stamp "0.26 CHECKSUM FAILED"; return 5; }
    rm -f "$KIT"/pieces26/q[0-9]*; touch "$X26/.unpacked"; stamp "0.26 kit unpacked"
  fi
  if [ ! -f "$SENV26/.done" ]; then   # the GPU kit's README way: --no-deps into a fresh venv, then the image .pth
    rm -rf "$SENV26"; "$IMAGE_PY" -m venv "$SENV26" || return 6
    "$SENV26/bin/python" -m pip install -q --no-index --no-deps --no-compile "$X26"/wheels26/*.whl \
      > "$KIT/pip-server-26.log" 2>&1 || { tail -5 "$KIT/pip-server-26.log"; return 7; }
    echo "$IMG" > "$(site_of "$SENV26")/zz_torch_image.pth"
    sed -i 's/^DEBUG_PERF = False/DEBUG_PERF = True/' \
      "$(site_of "$SENV26")"/vllm_omni/diffusion/models/wan2_2/pipeline_wan2_2*.py 2>/dev/null
    "$SENV26/bin/python" -m compileall -q -j 0 "$(site_of "$SENV26")" > /dev/null 2>&1
    touch "$SENV26/.done"; stamp "0.26 server venv"
  fi
  "$SENV26/bin/python" - "$OUT/versions26.json" > "$KIT/versions26.log" 2>&1 <<'PY'
import json, sys
import torch, vllm, vllm_omni
v = {"vllm": vllm.__version__, "vllm_omni": vllm_omni.__version__, "torch": torch.__version__,
     "cuda": torch.cuda.is_available()}
json.dump(v, open(sys.argv[1], "w"))
print("ENV server-26", json.dumps(v))
PY
  local rc=$?; grep -v -E "^(INFO|WARNING|DEBUG)" "$KIT/versions26.log" | tail -3
  [ "$rc" -eq 0 ] || { stamp "0.26 VENV IMPORT FAILED"; return 8; }
  cp "$OUT/versions26.json" "$KIT/versions26.json"
  # what mem26 runs under this venv imports here (a package the 0.30 kit brings and the 0.26 one lacks would
  # fail in this call, not in the long one)
  (set -o pipefail; cd "$REPO" && "$SENV26/bin/python" -c 'import contextlib, io, bench.gpu.memory26_verdict
from bench.gpu.__main__ import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    main(["calibrate", "--help"])     # builds every phase parser, as `python -m bench.gpu calibrate` does
from bench.gpu.common import import_package; import_package()
from vllm_omni_launcher.server.supervision.supervisor import Supervisor
from vllm_omni_launcher.client.api import VideoClient
from vllm_omni_launcher.planner.memory import plan' 2>&1 | tail -3) \
    || { stamp "0.26 VENV CANNOT RUN calibrate"; return 9; }
  stamp "setup26 done"
}

keep() { mkdir -p "$OUT"; cp -r "$R/$1" "$OUT/"; }

with_config() {   # the launcher's local settings device.sh setup wrote (extra_env, startup timeout), when there
  [ -f "$LAUNCHER_CONFIG" ] && export VLLM_OMNI_LAUNCHER_CONFIG="$LAUNCHER_CONFIG"; "$@"
}

case "${1:?receive26 NN | setup26 N | cli-first S | cli S | node S | overhead | fused S | mem26 S}" in
  receive26) mkdir -p "$KIT/pieces26"; mv "$REPO/.kit/q${2:?NN}" "$KIT/pieces26/q$2" \
      && stamp "0.26 piece $2 stashed ($(ls "$KIT/pieces26" | wc -l) here)" ;;
  setup26) setup26 "${2:?N pieces}" ;;
  cli-first) mkdir -p "$R/cli-first"; cd "$REPO"
    [ -z "${SERVER_CMD:-}" ] && export VLLM_OMNI_LAUNCHER_SERVER_ENV="$SENV"   # the rehearsal's config names the stub
    VLLM_OMNI_LAUNCHER_DATA_DIR="$KIT/i25-cli-first-data" with_config timeout -s INT -k 30 "${2:?deadline s}" \
      "$SENV/bin/python" -c 'import sys; from bench.gpu.common import import_package; import_package()
from vllm_omni_launcher.cli import main; sys.exit(main(sys.argv[1:]))' generate --model "$MODEL_DIR" --gpus 0 \
      --enforce-eager ${I25_SHAPE_ARGS:---width 1280 --height 704 --frames 121} --steps 4 --seed 44 \
      --prompt "A red fox trotting through fresh snow in a birch forest at sunrise" --out "$KIT/i25-cli-first.mp4" \
      --report-json "$R/cli-first/report.json" > "$R/cli-first/driver.log" 2>&1
    rc=$?; tail -4 "$R/cli-first/driver.log"; stamp "cli-first rc=$rc" | tee -a "$R/cli-first/driver.log"
    tar czf "$R/cli-first/server-log.tgz" -C "$KIT/i25-cli-first-data" --ignore-failed-read logs 2>/dev/null
    keep cli-first ;;
  cli) cd "$REPO" && with_config "$SENV/bin/python" -m bench.gpu levers --model "$MODEL_DIR" --out "$R/cli" \
      --data-dir "$KIT/i25-cli-data" --logs "$KIT/i25-logs/cli" --configs eager:4 --cli-jobs "${CLI_JOBS:-3}" \
      --cli-steps 4 ${I25_SHAPE_ARGS:-} ${CLI_ARGS:-} "${server_arg[@]}" "${cpu_arg[@]}" --deadline-s "${2:?deadline s}"
    tar czf "$R/cli/server-log.tgz" -C "$KIT/i25-logs" --ignore-failed-read cli 2>/dev/null; keep cli ;;
  node) cd "$REPO" && "$CENV/bin/python" -m bench.gpu native --comfy-dir "$X/comfyui" --python "$CENV/bin/python" \
      --base "$BASE" --launcher-env "$KIT/launcher-env.json" --detect "$KIT/detect.json" --family ti2v-5b \
      --out "$R/node" --sides ours --ours-variants eager --steps 4 --more-steps "${NODE_MORE_STEPS:-4,20}" \
      --tag n- ${I25_SHAPE_ARGS:-} ${NODE_ARGS:-} "${cpu_arg[@]}" --deadline-s "${2:?deadline s}"
    tar czf "$R/node/logs.tgz" -C "$BASE" --ignore-failed-read launcher-data/logs comfyui.log 2>/dev/null; keep node ;;
  overhead) cd "$REPO" && "$CENV/bin/python" -m bench.gpu.overhead_verdict --levers "$R/cli/levers.json" \
      --native "$R/node/report.json" --cli-first "$R/cli-first/report.json" --out "$R/verdicts"; keep verdicts ;;
  fused) mkdir -p "$R/fused"; limit=$(( ${2:?deadline s} - 15 ))
    [ "$limit" -gt "${CAP_FUSED:-150}" ] && limit="${CAP_FUSED:-150}"
    stamp "fused LoRA pair alone: SIGINT in ${limit} s"
    cd "$REPO" && with_config timeout -s INT -k 40 "$limit" "$SENV/bin/python" bench/lora_fused_check.py \
      --models "${KIT_MODELS:-$X/gpu-kit/models}" --out "$R/fused/fused-lora.json" --data-dir "$KIT/i25-fused-data" \
      "${server_arg[@]}" > "$R/fused/driver.log" 2>&1
    rc=$?; tail -12 "$R/fused/driver.log"; stamp "fused rc=$rc" | tee -a "$R/fused/driver.log"
    "$SENV/bin/python" bench/gpu_small_summary.py "$R/fused" >> "$R/fused/driver.log"
    grep -A12 "\"fused\": {" "$R/fused/driver.log" | tail -13
    tar czf "$R/fused/server-logs.tgz" -C "$KIT/i25-fused-data" --ignore-failed-read logs 2>/dev/null; keep fused ;;
  mem26) py26="${SERVER26_PY:-$SENV26/bin/python}"
    cd "$REPO" && with_config "$py26" -m bench.gpu calibrate --model "$MODEL_DIR" --out "$R/mem26" \
      --data-dir "$KIT/i25-mem26-data" --logs "$KIT/i25-logs/mem26" \
      --configs "${MEM26_CONFIGS:-none,tiling,layerwise_tiling,module_tiling}" \
      --shapes "${MEM26_SHAPES:-832x480x81,1024x576x97}" --held-back "${MEM26_SHAPES:-832x480x81,1024x576x97}" \
      --caps '' --job-guess-s "${MEM26_JOB_GUESS_S:-30}" --config-min-s "${MEM26_CONFIG_MIN_S:-110}" \
      ${MEM26_ARGS:-} "${server_arg[@]}" "${cpu_arg[@]}" --deadline-s "$(( ${2:?deadline s} - 20 ))" 2>&1 \
      | grep -v '^{' | tail -20
    "$py26" -m bench.gpu.memory26_verdict "$R/mem26/calibration.json" --versions "$KIT/versions26.json" \
      --out "$R/mem26"
    tar czf "$R/mem26/server-logs.tgz" -C "$KIT/i25-logs" --ignore-failed-read mem26 2>/dev/null; keep mem26 ;;
  *) echo "unknown issue25 step $1" >&2; return 2 ;;
esac
