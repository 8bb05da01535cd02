#!/usr/bin/env bash
# Issue 25's small checks on vLLM-Omni 0.30, one device call, on the GPU kit's tiny random-weight models,
# in order under one deadline (each step cut by SIGINT at its share, so its finally stops the server and
# its report keeps what ran; each report lands in $OUT as soon as its step ends):
#   1. fused startup LoRA pair, tiny T2V-A14B (bench/lora_fused_check.py)        -> $OUT/fused-lora.json
#   2. per-request PEFT LoRA + euler, tiny TI2V (bench/lora_gpu_check.py, the ready PEFT folder
#      bench/fixtures/tiny-wan22-ti2v-peft-lora: the device's server venv has no peft)  -> $OUT/peft-lora.json
#   3. 1 against 2 replicas on GPU 0, tiny TI2V (bench/throughput_bench.py --one-gpu)
#                                                    -> $OUT/replicas-tiny-ti2v.json + README.md (gpu_replicas.py)
#   then $OUT/server-logs.tgz (every server log) and $OUT/driver.log (all output + bench/gpu_small_summary.py's
#   SUMMARY line: all_ok, and the part the stub can prove): 6 files.
#
# usage: bash bench/gpu_small_checks.sh PY MODELS DEADLINE_S [STUB_CMD]
#   PY       the server venv's python (device: $HOME/gpukit/server-env/bin/python)
#   MODELS   the folder holding tiny-wan22-ti2v and tiny-wan22-t2v-a14b
#   STUB_CMD the CPU rehearsal's server (".venv-server/bin/python tests/contract/stub_vllm_serve.py");
#            without it the real server (vllm's CLI main in PY)
# Environment: OUT (default /tmp/gpu-small-out), WORK (scratch, default /tmp/gpu-small-checks),
#   CAP_FUSED / CAP_PEFT (each step's most seconds, default 150 / 60), R_ARGS (throughput_bench's job settings;
#   default the 0.26 table's: bench/results/h200-replicas-vllm-omni-0.26).
set -u
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="${1:?PY}"; MODELS="${2:?MODELS}"; DEADLINE="${3:?DEADLINE_S}"; STUB="${4:-}"
OUT="${OUT:-/tmp/gpu-small-out}"; WORK="${WORK:-/tmp/gpu-small-checks}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
rm -rf "$WORK"; mkdir -p "$WORK" "$OUT"
LOG="$OUT/driver.log"
stamp() { echo "[$(date +%T) +${SECONDS}s] $*" | tee -a "$LOG"; }
server=(); [ -n "$STUB" ] && server=(--server-cmd "$STUB")

step() {   # step NAME CAP_S RESERVE_S SCRIPT ARGS...: SCRIPT under min(CAP_S, time left - RESERVE_S), SIGINT then
  local name="$1" cap="$2" reserve="$3" limit rc
  shift 3
  limit=$(( DEADLINE - SECONDS - reserve )); [ "$limit" -gt "$cap" ] && limit="$cap"
  if [ "$limit" -lt 20 ]; then stamp "$name SKIPPED: ${limit} s left for it"; return; fi
  stamp "$name: $* (SIGINT in ${limit} s)"
  timeout -s INT -k 40 "$limit" "$PY" "$REPO/bench/$1" "${@:2}" 2>&1 | tee -a "$LOG"
  rc="${PIPESTATUS[0]}"; stamp "$name rc=$rc"
}

stamp "small checks: deadline ${DEADLINE} s, server ${STUB:-vllm (real)}"
command -v nvidia-smi > /dev/null \
  && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader | tee -a "$LOG"
# Each step's reserve is what the steps after it need at least on an H200 (0.30 is ready in ~25-40 s a server,
# tiny jobs take ~1 s): PEFT one server (~50 s), replicas 1 then 2 (~85 s; throughput_bench skips 2 if short).
step fused "${CAP_FUSED:-150}" 140 lora_fused_check.py --models "$MODELS" --out "$OUT/fused-lora.json" \
  --data-dir "$WORK/fused-data" "${server[@]}"
step peft "${CAP_PEFT:-60}" 85 lora_gpu_check.py --models "$MODELS" --out "$OUT/peft-lora.json" \
  --lora "$REPO/bench/fixtures/tiny-wan22-ti2v-peft-lora" --data-dir "$WORK/peft-data" "${server[@]}"
left=$(( DEADLINE - SECONDS - 15 ))
replica_server=(--vllm); [ -n "$STUB" ] && replica_server=()    # throughput_bench's default server is the stub
read -ra rargs <<< "${R_ARGS:---jobs 8 --shape 480x320x33 --steps 10 --poll-s 0.2}"
step replicas "$left" 15 throughput_bench.py --model "$MODELS/tiny-wan22-ti2v" --one-gpu --eager --replicas 1,2 \
  --label tiny-ti2v-0.30 --out "$OUT/replicas-tiny-ti2v.json" --server-logs "$WORK/replica-logs" \
  --deadline-s "$(( left - 5 ))" "${rargs[@]}" "${replica_server[@]}"
"$PY" "$REPO/bench/gpu_replicas.py" "$OUT" | tee -a "$LOG"
(cd "$WORK" && tar czf "$OUT/server-logs.tgz" --ignore-failed-read fused-data/logs peft-data/logs replica-logs \
  2>/dev/null)
"$PY" "$REPO/bench/gpu_small_summary.py" "$OUT" | tee -a "$LOG"
stamp "small checks done; files: $(find "$OUT" -maxdepth 1 -type f -printf '%f ')"
