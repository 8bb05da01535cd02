#!/usr/bin/env bash
# Device-side phases of the issue-15 GPU session (one H200, no registry, no network).
# Each phase is one `run` call, self-contained (it starts ComfyUI / the server and stops them),
# well under 600 s, and writes a JSON report part + logs to $OUT/<phase>/.
#
#   bash bench/gpu_session.sh receive NN   move .kit/pNN (carried) into $KIT/pieces (nothing else)
#   bash bench/gpu_session.sh setup        assemble + install as a user would (idempotent; A runs it)
#   bash bench/gpu_session.sh A [CHECKS]   setup, then the ComfyUI checks (default t2v,cached,i2v)
#   bash bench/gpu_session.sh A2           setup, then cancel + SIGKILL checks (eager server)
#   bash bench/gpu_session.sh B            planner calibration + overhead (Supervisor + client)
#   bash bench/gpu_session.sh cpu          the CPU rehearsal of A + A2 here (stub server)
#   bash bench/gpu_session.sh O            setup, then issue 14's overhead bench on the full-size TI2V-5B
#                                          (eager, Supervisor + client; O_ARGS replaces its options) -> $OUT/O/
#   bash bench/gpu_session.sh A14B MODE    MODE eager | compile: setup without TI2V-5B, the full-size
#                                          T2V-A14B (built once per warm machine, ~1-2 min), then
#                                          bench/gpu_a14b.py on one GPU -> $OUT/A14B/MODE.{json,log}
#   bash bench/gpu_session.sh R [tiny|full] setup without building TI2V-5B (cheap once O ran in this warm
#                                          machine), then issue 17's replica bench on GPU 0: 1 against 2
#                                          replicas (bench/throughput_bench.py --one-gpu, Supervisor + client)
#                                          of the tiny TI2V (default) or the full-size TI2V-5B O built
#                                          (full; R_ARGS replaces the request options) -> $OUT/R/
#   bash bench/gpu_session.sh J            setup without building TI2V-5B, then issue 17's head + joined replica
#                                          on GPU 0 (bench/gpu_join.py: our HeadRole and JoinRole Supervisors in one
#                                          driver, the tiny TI2V, eager; jobs, kill -9 of the joined runtime, the
#                                          restarts, Stop) -> $OUT/J/ (J_ARGS, J_LIMIT_S default 330 s)
#   bash bench/gpu_session.sh cpu-o        the CPU rehearsal of O (stub server, tiny TI2V)
#   bash bench/gpu_session.sh cpu-r        the CPU rehearsal of R (stub server, tiny TI2V)
#   bash bench/gpu_session.sh cpu-a14b     the CPU rehearsal of A14B (stub server, tiny-dimension A14B)
#   bash bench/gpu_session.sh cpu-j        the CPU rehearsal of J (stub server, tiny TI2V; ~10 vLLM imports)
#
# setup: pieces -> $KIT/{wheels,comfy-wheels,comfyui,gpu-kit}; server venv = image python -m venv
# + zz_image.pth (the image python is itself a venv, so --system-site-packages would not see its
# torch) + the 48 kit wheels; ComfyUI venv = the same + ComfyUI's missing wheels + av (from the
# kit) for our package; the repo linked into custom_nodes; the full-size random-weight TI2V-5B
# (make_fullsize_ti2v.py, ~23 GB, ~1 min on the GPU) in <base>/models/diffusers/ti2v-5b-fullsize.
# Environment: KIT (default /tmp/kit), OUT (the device's $OUT), IMAGE_PY (default /opt/torch/.venv/bin/python3),
# DEADLINE_S (seconds the driver may use), DRIVER_ARGS (more driver options, e.g. "--eager --steps 4"),
# B_ARGS (more calibration options, e.g. "--only tiling_module"), NO_LORA=1 (B without the LoRA check),
# NO_TI2V=1 (setup skips building the TI2V-5B folder; the A14B phases set it), O_ARGS (the overhead
# bench's options), R_ARGS (the replica bench's request options), R_LIMIT_S (R's end, default 300 s of
# this script: SIGINT then, the bench's finally stops the server), A14B_ARGS (more bench/gpu_a14b.py
# options, e.g. "--shapes 832x480x81").
# Disk (64 GiB on the device): TI2V-5B takes ~23 GB and the A14B folder ~29 GB (+11 GB when it
# cannot hardlink TI2V-5B's encoder); when df says the A14B folder will not fit, the TI2V-5B
# transformer and VAE are deleted first (its text encoder is kept for the link; O must run before).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
KIT="${KIT:-/tmp/kit}"
OUT="${OUT:-/tmp/gpu-session-out}"
IMAGE_PY="${IMAGE_PY:-/opt/torch/.venv/bin/python3}"
SERVER_ENV="$KIT/server-env"
COMFY_ENV="$KIT/comfy-env"
BASE="$KIT/comfy-base"
MODEL=ti2v-5b-fullsize
A14B_MODEL=t2v-a14b-fullsize
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1
export PYTHONUNBUFFERED=1
phase="${1:?phase: receive NN | setup | A | A2 | B | O | R [tiny|full] | J | A14B eager|compile | cpu | cpu-o | cpu-r | cpu-a14b | cpu-j}"

stamp() { echo "[$(date +%T)] $*"; }

make_venv() {   # make_venv DIR WHEEL...: image python venv that also sees the image's packages
  local dir="$1"; shift
  "$IMAGE_PY" -m venv "$dir"
  local site; site="$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  "$IMAGE_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site/zz_image.pth"
  "$dir/bin/python" -m pip install -q --no-index --no-deps --no-compile "$@"
}

launcher_env() {   # the launcher's local settings for ComfyUI's process (never the workflow)
  local config="$KIT/launcher-config.json"
  printf '{"extra_env": {"HF_HUB_OFFLINE": "1", "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}, "startup_timeout_s": 900}\n' > "$config"
  printf '{"VLLM_OMNI_LAUNCHER_SERVER_ENV": "%s", "VLLM_OMNI_LAUNCHER_CONFIG": "%s"}\n' "$SERVER_ENV" "$config" \
    > "$KIT/launcher-env.json"
}

setup() {
  local t0=$SECONDS log="$OUT/setup.log"
  mkdir -p "$OUT"
  {
    if [ ! -f "$KIT/.unpacked" ]; then
      stamp "unpack $(ls "$KIT"/pieces | wc -l) pieces"
      (cd "$KIT" && cat pieces/p[0-9][0-9] | tar x)
      rm -rf "$KIT/pieces"; touch "$KIT/.unpacked"
    fi
    if [ ! -x "$SERVER_ENV/bin/vllm" ]; then
      stamp "server venv"; make_venv "$SERVER_ENV" "$KIT"/wheels/*.whl
    fi
    if [ ! -f "$COMFY_ENV/.done" ]; then
      stamp "ComfyUI venv"   # + from the server kit: av (our package) and pydantic (ComfyUI's pyproject parser)
      make_venv "$COMFY_ENV" "$KIT"/comfy-wheels/*.whl "$KIT"/wheels/{av,pydantic,pydantic_core,pydantic_settings,annotated_types,typing_inspection,python_dotenv}-[0-9]*.whl
      touch "$COMFY_ENV/.done"
    fi
    mkdir -p "$BASE/models/diffusers" "$BASE/custom_nodes"
    if [ ! -f "$BASE/models/diffusers/$MODEL/.done" ] && [ -z "${NO_TI2V:-}" ]; then
      stamp "full-size TI2V-5B"
      "$SERVER_ENV/bin/python" "$KIT/gpu-kit/make_fullsize_ti2v.py" "$KIT/gpu-kit/models/tiny-wan22-ti2v" \
        "$BASE/models/diffusers/$MODEL"
      touch "$BASE/models/diffusers/$MODEL/.done"
    fi
    launcher_env
    "$SERVER_ENV/bin/python" -c 'import vllm, vllm_omni, torch; print("vllm", vllm.__version__, "vllm-omni", vllm_omni.__version__, "torch", torch.__version__, torch.cuda.is_available())'
    "$COMFY_ENV/bin/python" -c 'import av, torchsde, alembic, sqlalchemy, pynvml; print("comfy env ok, av", av.__version__)'
    stamp "setup done in $((SECONDS - t0)) s"
  } 2>&1 | tee -a "$log"
}

driver() {   # driver OUTDIR ARGS...: the ComfyUI driver under ComfyUI's python
  local out="$1"; shift
  "$COMFY_ENV/bin/python" "$REPO/bench/gpu_comfyui_e2e.py" --comfy-dir "$KIT/comfyui" --python "$COMFY_ENV/bin/python" \
    --base "$BASE" --model-folder "$MODEL" --launcher-env "$KIT/launcher-env.json" --out "$out" "$@" ${DRIVER_ARGS:-} 2>&1 \
    | tee "$out.log"
}

gpu_state() {   # gpu_state FILE: the GPU and what runs on it (a leftover server would skew every number)
  if command -v nvidia-smi > /dev/null; then
    { nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv
      nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv; } > "$1" 2>&1 || true
  else echo "no nvidia-smi (CPU rehearsal)" > "$1"; fi
  df -h "$BASE" "${TMPDIR:-/tmp}" >> "$1" 2>&1 || true
}

o_bench() {   # o_bench PY MODEL_DIR [SERVER_CMD]: issue 14's overhead bench -> $OUT/O/overhead.{json,log}
  local py="$1" model="$2" rc=0
  local args=(${O_ARGS:---shapes 1280x704x121,832x480x49 --steps 4 --repeat 2 --warmup 1 --poll-modes due,due@0.02 --lever-repeat 3 --natural})
  [ -n "${3:-}" ] && args+=(--server-cmd "$3")
  mkdir -p "$OUT/O"; gpu_state "$OUT/O/gpu-before.txt"
  stamp "overhead bench ${args[*]}" | tee "$OUT/O/overhead.log"
  # SIGINT at the call's end: the bench's finally stops the server; its per-job lines are in the log
  timeout -s INT "$(( ${O_LIMIT_S:-585} - SECONDS ))" "$py" "$REPO/bench/overhead_bench.py" --model "$model" \
    "${args[@]}" > "$OUT/O/overhead.json" 2> >(tee -a "$OUT/O/overhead.log" >&2) || rc=$?
  sleep 1; stamp "overhead bench rc=$rc, $(wc -c < "$OUT/O/overhead.json") bytes of JSON" | tee -a "$OUT/O/overhead.log"
}

bounded_bench() {   # bounded_bench DIR LABEL LIMIT_S BENCH REPORT PY ARGS...: one bench run cut at LIMIT_S -> DIR/LABEL.log
  local dir="$1" label="$2" limit="$3" bench="$4" report="$5" py="$6" rc=0
  shift 6
  mkdir -p "$dir"; gpu_state "$dir/gpu-$label.txt"
  stamp "$bench $* (SIGINT in ${limit} s)" | tee "$dir/$label.log"
  # SIGINT at the phase's end: the bench's finally stops its servers and writes what it measured
  timeout -s INT "$limit" "$py" "$REPO/bench/$bench" "$@" 2>&1 | tee -a "$dir/$label.log" || rc=$?
  sleep 1; gpu_state "$KIT/.gpu-after"
  { echo "--- after the bench (rc=$rc)"; cat "$KIT/.gpu-after"; } >> "$dir/gpu-$label.txt"; rm -f "$KIT/.gpu-after"
  "$py" "$REPO/bench/$report" "$dir" | tee -a "$dir/$label.log"
  stamp "$bench $label rc=$rc" | tee -a "$dir/$label.log"
}

r_bench() {   # r_bench PY MODEL_DIR LABEL [SERVER_CMD]: issue 17's replica bench on GPU 0 -> $OUT/R/LABEL.{json,log}
  local limit=$(( ${R_LIMIT_S:-300} - SECONDS )) server=(--vllm)
  [ -n "${4:-}" ] && server=(--server-cmd "$4")
  bounded_bench "$OUT/R" "$3" "$limit" throughput_bench.py gpu_replicas.py "$1" --model "$2" --one-gpu --eager \
    --replicas 1,2 --label "$3" --out "$OUT/R/$3.json" --server-logs "$OUT/R" --deadline-s "$((limit - 8))" \
    ${R_ARGS:---jobs 8 --shape 480x320x33 --steps 10 --poll-s 0.2} "${server[@]}"
}

j_bench() {   # j_bench PY MODEL_DIR LABEL [SERVER_CMD]: issue 17's head + joined replica on GPU 0 -> $OUT/J/LABEL.{json,log}
  local limit=$(( ${J_LIMIT_S:-330} - SECONDS )) server=(--vllm)
  [ -n "${4:-}" ] && server=(--server-cmd "$4")
  bounded_bench "$OUT/J" "$3" "$limit" gpu_join.py gpu_join_report.py "$1" --model "$2" --eager --label "$3" \
    --out "$OUT/J/$3.json" --server-logs "$OUT/J" --deadline-s "$((limit - 10))" \
    ${J_ARGS:---jobs 2 --jobs-after 2 --shape 480x320x33 --steps 10 --stall-s 40 --poll-s 0.2} "${server[@]}"
}

a14b_model() {   # a14b_model PY DIR TI2V_DIR [--rehearsal]: the full-size random-weight T2V-A14B, once
  local py="$1" dir="$2" ti2v="$3" te=() need="${A14B_NEED_GIB:-31}" avail
  [ -f "$dir/.done" ] && { stamp "A14B folder already built: $dir"; return 0; }
  if [ -f "$ti2v/.done" ] || [ -f "$ti2v/.te_only" ]; then te=(--text-encoder-from "$ti2v/text_encoder")
  else need=$((need + 11)); fi
  mkdir -p "$(dirname "$dir")"; rm -rf "$dir"
  avail=$(df -BG --output=avail "$(dirname "$dir")" | tail -1 | tr -dc 0-9)
  stamp "A14B build: ${avail} GiB free, ~${need} GiB needed, encoder ${te[*]:-built}"
  if [ "$avail" -lt "$need" ] && [ ${#te[@]} -gt 0 ] && [ -d "$ti2v/transformer" ]; then
    stamp "not enough disk: deleting the TI2V-5B transformer and VAE (text encoder kept for the link)"
    rm -rf "$ti2v/transformer" "$ti2v/vae" "$ti2v/.done"; touch "$ti2v/.te_only"
    stamp "now $(df -BG --output=avail "$(dirname "$dir")" | tail -1 | tr -dc 0-9) GiB free"
  fi
  local t0=$SECONDS
  "$py" "$REPO/bench/make_fullsize_a14b.py" "$KIT/gpu-kit/models/tiny-wan22-t2v-a14b" "$dir" "${te[@]}" "${@:4}"
  touch "$dir/.done"; stamp "A14B folder built in $((SECONDS - t0)) s: $(du -sh "$dir" | cut -f1)"
}

a14b_bench() {   # a14b_bench PY MODEL_DIR MODE [SERVER_CMD]: bench/gpu_a14b.py -> $OUT/A14B/MODE.{json,log}
  local py="$1" model="$2" mode="$3"
  local args=(--model "$model" --mode "$mode" --out "$OUT/A14B/$mode.json" --deadline-s "${DEADLINE_S:-$((560 - SECONDS))}")
  [ -n "${4:-}" ] && args+=(--server-cmd "$4")
  gpu_state "$OUT/A14B/gpu-before-$mode.txt"
  "$py" "$REPO/bench/gpu_a14b.py" "${args[@]}" ${A14B_ARGS:-} 2>&1 | tee "$OUT/A14B/$mode.log" || true
  gpu_state "$OUT/A14B/gpu-after-$mode.txt"
}

case "$phase" in
  receive)
    n="${2:?receive NN}"; mkdir -p "$KIT/pieces"; mv "$REPO/.kit/p$n" "$KIT/pieces/"; ls -la "$KIT/pieces" ;;
  setup) setup ;;
  A)
    setup; nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
    driver "$OUT/A" --checks "${2:-t2v,cached,i2v}" --deadline-s "${DEADLINE_S:-$((560 - SECONDS))}" ;;
  A2)
    setup; driver "$OUT/A2" --eager --checks "${2:-cancel,kill}" --deadline-s "${DEADLINE_S:-$((560 - SECONDS))}" ;;
  B)
    setup; mkdir -p "$OUT/B"
    if [ -f "$REPO/bench/lora_gpu_check.py" ] && [ -z "${NO_LORA:-}" ]; then   # the LoRA helper's check on the tiny model (~90 s), first
      timeout 200 "$SERVER_ENV/bin/python" "$REPO/bench/lora_gpu_check.py" --models "$KIT/gpu-kit/models" \
        --out "$OUT/B/lora.json" --data-dir "$KIT/lora-data" 2>&1 | tee "$OUT/B/lora.log" || true
    fi
    "$SERVER_ENV/bin/python" "$REPO/bench/gpu_e2e.py" --fullsize "$BASE/models/diffusers/$MODEL" \
      --out "$OUT/B/calibration.json" --data-dir "$KIT/b-data" --deadline-s "${DEADLINE_S:-$((550 - SECONDS))}" ${B_ARGS:-} \
      2>&1 | tee "$OUT/B/calibration.log" || true ;;
  O) setup; o_bench "$SERVER_ENV/bin/python" "$BASE/models/diffusers/$MODEL" ;;
  R)
    NO_TI2V=1 setup
    if [ "${2:-tiny}" = full ]; then
      [ -f "$BASE/models/diffusers/$MODEL/.done" ] || { echo "R full: no full-size TI2V-5B here (run O first)" >&2; exit 2; }
      R_ARGS="${R_ARGS:---jobs 8 --shape 832x480x49 --steps 4 --poll-s 0.2}" \
        r_bench "$SERVER_ENV/bin/python" "$BASE/models/diffusers/$MODEL" ti2v-5b-fullsize
    else r_bench "$SERVER_ENV/bin/python" "$KIT/gpu-kit/models/tiny-wan22-ti2v" tiny-ti2v; fi ;;
  J)   # the server logs go back as one tarball: a device call returns at most 8 files
    NO_TI2V=1 setup; j_bench "$SERVER_ENV/bin/python" "$KIT/gpu-kit/models/tiny-wan22-ti2v" tiny-ti2v
    (cd "$OUT/J" && tar czf server-logs.tgz ./*.server.log && rm -f ./*.server.log) || true ;;
  A14B)
    mode="${2:?A14B eager|compile}"; mkdir -p "$OUT/A14B"
    NO_TI2V=1 setup
    a14b_model "$SERVER_ENV/bin/python" "$BASE/models/diffusers/$A14B_MODEL" "$BASE/models/diffusers/$MODEL" 2>&1 \
      | tee -a "$OUT/A14B/build.log"
    a14b_bench "$SERVER_ENV/bin/python" "$BASE/models/diffusers/$A14B_MODEL" "$mode" ;;
  cpu-o|cpu-r|cpu-a14b|cpu-j)   # rehearsal here of O / R / A14B / J: the same functions, the stub server, tiny models on CPU
    : "${VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON:?set it to the stub server python (.venv-server/bin/python)}"
    KIT="${CPU_KIT:-/tmp/gpu-session-cpu-kit}"; BASE="$KIT/comfy-base"; mkdir -p "$KIT/gpu-kit" "$BASE/models/diffusers"
    rm -rf "$KIT/gpu-kit/models"; cp -r "${GPU_KIT:?set GPU_KIT to the GPU kit folder}/models" "$KIT/gpu-kit/models"
    chmod -R u+w "$KIT"
    stub="$VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON $REPO/tests/contract/stub_vllm_serve.py"
    export VLLM_OMNI_STUB_STEP_S="${STUB_STEP_S:-0.05}" VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB=141
    if [ "$phase" = cpu-o ]; then
      O_ARGS="${O_ARGS:---shapes 256x160x9,320x192x17 --steps 4 --repeat 1 --warmup 1 --lever-repeat 1}" \
        o_bench "$VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON" "$KIT/gpu-kit/models/tiny-wan22-ti2v" "$stub"
    elif [ "$phase" = cpu-r ]; then   # slower here (2 cores: each replica imports vLLM in turn)
      R_ARGS="${R_ARGS:---jobs 4 --shape 256x128x9 --steps 4 --step-s 0.25 --poll-s 0.1}" R_LIMIT_S="${R_LIMIT_S:-1200}" \
        r_bench "$VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON" "$KIT/gpu-kit/models/tiny-wan22-ti2v" tiny-ti2v "$stub"
    elif [ "$phase" = cpu-j ]; then   # slower here (2 cores: ~10 vLLM-importing processes over the run)
      J_ARGS="${J_ARGS:---jobs 4 --jobs-after 2 --shape 256x128x9 --steps 4 --step-s 0.25 --stall-s 25 --poll-s 0.2}" \
        J_LIMIT_S="${J_LIMIT_S:-1500}" j_bench "$VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON" \
        "$KIT/gpu-kit/models/tiny-wan22-ti2v" tiny-ti2v "$stub"
    else   # twice: the encoder built, then linked from a TI2V stand-in with too little "disk" (the prune path)
      mkdir -p "$OUT/A14B"; a14b="$BASE/models/diffusers/$A14B_MODEL"; ti2v="$BASE/models/diffusers/$MODEL"
      rm -rf "$ti2v" "$a14b"
      a14b_model "$VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON" "$a14b" "$ti2v" --rehearsal 2>&1 | tee "$OUT/A14B/build.log"
      mkdir -p "$ti2v/transformer" "$ti2v/vae"; cp -r "$a14b/text_encoder" "$ti2v/"; touch "$ti2v/.done"; rm "$a14b/.done"
      A14B_NEED_GIB=100000 a14b_model "$VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON" "$a14b" "$ti2v" --rehearsal 2>&1 \
        | tee -a "$OUT/A14B/build.log"
      for mode in eager compile; do
        A14B_ARGS="${A14B_ARGS:---shapes 256x160x9,320x192x17}" DEADLINE_S="${DEADLINE_S:-300}" \
          a14b_bench "$VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON" "$a14b" "$mode" "$stub"
      done
      "$VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON" "$REPO/bench/gpu_a14b_table.py" "$OUT/A14B"
    fi ;;
  cpu)   # rehearsal here: real ComfyUI on CPU, the stub server as the server command
    : "${VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON:?set it to the stub server python (.venv-server/bin/python)}"
    COMFY_SRC="${COMFY_SRC:-/work/comfyui-src}"; COMFY_PY="${COMFY_PY:-/work/comfyui-venv/bin/python}"
    CPU_BASE="${CPU_BASE:-/tmp/gpu-e2e-cpu}"; rm -rf "$CPU_BASE"; mkdir -p "$CPU_BASE/models/diffusers" "$OUT"
    cp -r "${GPU_KIT:?set GPU_KIT to the GPU kit folder}/models/tiny-wan22-ti2v" "$CPU_BASE/models/diffusers/tiny-ti2v"
    chmod -R u+w "$CPU_BASE"
    printf '{"VLLM_OMNI_LAUNCHER_SERVER_CMD": "%s %s", "VLLM_OMNI_LAUNCHER_CONFIG": "%s", "VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB": "141", "VLLM_OMNI_STUB_STEP_S": "%s"}\n' \
      "$VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON" "$REPO/tests/contract/stub_vllm_serve.py" "$CPU_BASE/no-config.json" \
      "${STUB_STEP_S:-0.2}" > "$CPU_BASE/launcher-env.json"
    "$COMFY_PY" "$REPO/bench/gpu_comfyui_e2e.py" --cpu --comfy-dir "$COMFY_SRC" --python "$COMFY_PY" --base "$CPU_BASE" \
      --model-folder tiny-ti2v --launcher-env "$CPU_BASE/launcher-env.json" --out "$OUT/cpu" \
      --width "${W:-256}" --height "${H:-160}" --frames "${F:-9}" --steps "${S:-4}" --cancel-steps 60 \
      --checks "${2:-t2v,cached,i2v,cancel,kill}" --deadline-s 900 2>&1 | tee "$OUT/cpu.log" ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
