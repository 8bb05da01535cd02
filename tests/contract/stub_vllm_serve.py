#!/usr/bin/env python3
"""``vllm serve MODEL --omni`` with the real vLLM-Omni 0.30 server and a fake GPU.

Usage (server python, i.e. the venv with vllm==0.30.0 and vllm-omni==0.30.0)::

    python tests/contract/stub_vllm_serve.py serve Wan-AI/Wan2.2-T2V-A14B-Diffusers --omni --port 8091 [flags]

The argv after the script name is exactly what the ``vllm`` console script receives; it
is handed unchanged to ``vllm.entrypoints.cli.main.main`` (the function the ``vllm``
script runs), so all of this is upstream code, executed as on a GPU machine:
argparse (``error: unrecognized arguments``, exit 2), ``OmniServeCommand.validate``,
config resolution, ``AsyncOmni`` / ``AsyncOmniEngine`` / Orchestrator / ``StageRuntime`` /
``build_diffusion_config`` (device check), ``InlineStageDiffusionClient``,
``DiffusionEngine`` (request scheduler, the Wan pre-processing hook that rejects an I2V
request without image, warm-up, abort handling, output formatting), the FastAPI app
(routes, ``--api-key``/``VLLM_API_KEY`` middleware, multipart parsing, validation, job
store, MP4 encoder, storage), uvicorn, and the shutdown path.

Replaced (the seams; see ``upstream.py`` for the first two)
----------------------------------------------------------
1. ``huggingface_hub``'s HTTP client, via its own hook ``set_client_factory``: a fake Hub
   answering from ``tests/contract/fixtures/hf/Wan-AI/*`` (config JSON only).  Why: no
   network, no 100 GB of weights; the stub needs the configs only.  The model id stays the
   HF id everywhere; an unknown id gets the Hub's 401 ``RepoNotFound`` answer, so upstream
   raises its own ``Repository not found for '<id>'``.
2. The device inventory of ``vllm_omni.platforms.current_omni_platform``
   (``device_control_env_var``, ``device_name``, ``get_device_count``).  Why: there is no
   GPU to count.  The machine's GPUs are those in ``CUDA_VISIBLE_DEVICES`` at start (or
   ``0..VLLM_OMNI_STUB_DEVICE_COUNT-1``, default 1, when unset).
3. ``DiffusionExecutor.get_class`` (``vllm_omni/diffusion/executor/abstract.py``), the
   factory ``DiffusionEngine`` uses for the object that owns the GPU workers.  The real
   function still runs (an invalid ``--distributed-executor-backend`` fails as upstream);
   then :class:`StubGpuExecutor` is returned instead of ``UniProcDiffusionExecutor`` /
   ``MultiprocDiffusionExecutor``.  Why: this is the GPU.  It implements the
   ``DiffusionExecutor`` interface the engine drives: ``execute_request`` /
   ``execute_batch`` / ``execute_step``, ``collective_rpc``, ``check_health``,
   ``register_failure_callback``, ``is_dead``, ``shutdown``.

What the fake GPU does
----------------------
* Start: prints the worker-side lines a real worker prints (``Worker N: Initialized
  device...``, real ``prefetch_subfolders`` against the fake Hub, ``Multi-thread loading
  shards``, ``Loading weights took``, ``Model loading took X GiB and Y seconds`` with a
  size estimated from the configs, ``Model runner: Model loaded successfully.``, compile
  notes, ``Initialization complete``) through the real module loggers with the real
  source file/line in the record; without the ``(APIServer pid=..)`` prefix when the real
  backend would be the multi-process one (worker processes).  These lines are copies,
  declared once in ``upstream_lines.py``: each must be logged by its module in the installed
  upstream, or the stub exits 3 at start saying which one drifted.  A rank bound to a GPU the
  machine lacks fails like CUDA (``invalid device ordinal``).
* Per request, what ``Wan22Pipeline.forward`` / ``Wan22I2VPipeline.forward`` decide before
  the GPU work: size floored to ``vae.scale_factor_spatial * patch_size`` (A14B /16,
  TI2V-5B /32) or, for I2V, the ``divisible by 16`` error; ``num_frames`` -> ``n//4*4+1``;
  40 steps by default; the ``boundary_ratio is required`` warning; validation through the
  real ``resolve_wan_sample_solver`` / ``resolve_wan_flow_shift`` /
  ``resolve_wan_guidance_scales``.  The denoise loop is the real
  ``ProgressBarMixin.progress_bar`` (tqdm, default format, on stderr) with one step per
  ``VLLM_OMNI_STUB_STEP_S``.  Frames: ``frame_code.encode(i, seed, w, h)``, returned as
  the decoded video a Wan VAE returns (BCTHW, [-1, 1], bf16) after the runner's real
  ``prepare_diffusion_media_for_transport``.  Exceptions become the request's error
  output, as in ``UniProcDiffusionExecutor.execute_request``.  A request with
  ``extra_params.preencode_mp4`` (0.30's worker-side MP4, which the launcher sends to the servers it
  starts) is read by the real ``resolve_wan_preencode_mp4`` (its refusal of frame interpolation
  included) and gets the MP4 the real Wan pipeline makes: the frames in the VAE's temporal chunks
  through upstream's ``ChunkedVideoMP4Session``, returned as the pipeline's output bytes, which
  upstream's Wan post-process and API layer then pass on without encoding again.
* After the frames, the rest of a job is upstream's too: the API layer encodes the MP4, stores
  it and logs ``Video request ID persisted KEY output file.`` right before the job turns
  completed (the launcher's last fast-poll hint reads it).  The stub prints no copy of such a
  line; it is declared in ``upstream_lines.SERVED_LINES`` and checked at start like the copies.
* DELETE of a running job is upstream's: the engine cannot interrupt ``execute_request``
  (Wan has no cooperative cancel), so the steps keep printing to the end and the output
  is dropped.

Fault knobs (environment, read at start)
----------------------------------------
``VLLM_OMNI_STUB_LOAD_DELAY_S``   seconds of "weight loading" (the port refuses meanwhile).
``VLLM_OMNI_STUB_STEP_S``         seconds per denoise step (default 0.02).
``VLLM_OMNI_STUB_OOM_AT_LOAD=1``  torch CUDA OOM while loading: stage init fails, exit 1.
``VLLM_OMNI_STUB_OOM_UNLESS=f[,f]`` the same, unless one of these flags is in argv.
``VLLM_OMNI_STUB_OOM_IN_JOB=N``   job N (1-based, warm-up excluded) raises the CUDA OOM
                                  mid-denoise: that job fails (500), the server stays up.
``VLLM_OMNI_STUB_CRASH_AFTER_JOBS=N`` once job N completed (async: its MP4 is stored),
                                  the engine dies: worker-death lines, the real failure
                                  callbacks, an ``EngineDeadError`` line, children killed,
                                  exit 1.
``VLLM_OMNI_STUB_HANG_AFTER_JOBS=N``  once job N completed, the API event loop blocks for
                                  good: requests hang, SIGTERM is not acted on (a wedged
                                  server), SIGKILL works.
``VLLM_OMNI_STUB_HANG_IN_JOB=1``  every job stalls after its first step, forever.
``VLLM_OMNI_STUB_FAULT_GRACE_S``  delay between job N completing and the crash / hang
                                  (default 1.0), so a poller sees it completed.
``VLLM_OMNI_STUB_DEVICE_COUNT``   GPUs when ``CUDA_VISIBLE_DEVICES`` is unset (default 1).
``VLLM_OMNI_STUB_JOBS_FILE=PATH`` one line ``POST /v1/videos <status>`` appended per
                                  job request the API answered (status 200: accepted),
                                  taken from uvicorn's access log records; count the
                                  ``200`` lines for the jobs a client sent.

Per-request knobs (so one shared stub serves many tests)
--------------------------------------------------------
Through upstream's own per-request channel, the ``extra_params`` form field (a JSON
object that the API merges into the request's ``sampling_params.extra_args``, as it does
for any model-specific parameter): ``extra_params={"stub_oom": true}`` makes that job
raise the CUDA OOM mid-denoise, exactly like ``VLLM_OMNI_STUB_OOM_IN_JOB`` does for job N, and
``extra_params={"stub_hang": true}`` makes that job stall after its first step, exactly like
``VLLM_OMNI_STUB_HANG_IN_JOB`` does for every job (the engine stays busy with it until the
process ends, so it is the last job a stub runs).

The process writes ``STUB_PID=<pid>`` to stderr first.  Unless
``VLLM_OMNI_SERVER_STORAGE__PATH`` (or the deprecated ``VLLM_OMNI_STORAGE_PATH``) is set,
job files go to a per-process temporary directory, removed at exit.  Logs: upstream's
logger writes to stdout, tqdm and tracebacks to stderr.

Stage subprocesses: for deploy YAMLs with ``num_replicas > 1`` (or multi-stage pipelines)
upstream spawns ``StageDiffusionProc`` processes (multiprocessing "spawn"), which re-import
this script as ``__mp_main__`` and so get the same seams; each prints its own
``STUB_PID`` line and counts its own jobs for the knobs.

Modules: this file is the entry point (seams, CLI, ``VLLM_OMNI_STUB_JOBS_FILE``); the fake GPU is
``stub_serve_gpu.py``, built from ``stub_serve_knobs.py`` (the fault knobs), ``stub_serve_worker_log.py``
(the copied upstream lines), ``stub_serve_model_facts.py`` (what the configs say) and
``stub_serve_faults.py`` (crash / hang after N jobs).

Not emulated: sleep/wake-up and LoRA RPCs answer trivially; a request batch
(``max_num_seqs > 1``) runs one request after the other instead of as one forward.
"""
from __future__ import annotations

import os
import sys

sys.stderr.write(f"STUB_PID={os.getpid()}\n")
sys.stderr.flush()

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import logging  # noqa: E402

import upstream  # noqa: E402

upstream.server_python_ok()

from stub_serve_knobs import ARGV  # noqa: E402

# Job storage: a private directory unless the caller chose one (upstream default /tmp/storage).
if not os.environ.get("VLLM_OMNI_SERVER_STORAGE__PATH") and not os.environ.get("VLLM_OMNI_STORAGE_PATH"):
    os.environ["VLLM_OMNI_SERVER_STORAGE__PATH"] = upstream.make_temp_dir("storage")

upstream.snapshot_hardware()
upstream.prepare_process_env()

with upstream.collector_paused():   # the imports of vLLM, without garbage-collector passes
    from vllm.entrypoints.cli.main import main as vllm_main  # (what the `vllm` script runs)

    upstream.install_fixture_hub()
    upstream.install_device_inventory()

    # the fake GPU (stub_serve_gpu) and its parts: stub_serve_worker_log checks the copied upstream
    # lines on import (exit 3 on drift), stub_serve_faults reads the storage directory chosen above
    from stub_serve_gpu import StubGpuExecutor  # noqa: E402

# Module level on purpose: upstream's stage subprocesses (multiprocessing "spawn") re-import
# this script as ``__mp_main__``, so they get the same seams.
upstream.install_executor(StubGpuExecutor)


class JobCounter(logging.Filter):
    """Appends ``POST /v1/videos <status>`` to a file for each job request the API answered.

    A filter on uvicorn's access logger sees every record that logger makes (method, path
    and status are its arguments) and lets each one through unchanged, so the server's own
    output stays exactly upstream's.
    """

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and args[1] == "POST" \
                and str(args[2]).split("?", 1)[0] == "/v1/videos":
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(f"POST /v1/videos {args[4]}\n")
        return True


def main() -> int:
    jobs_file = os.environ.get("VLLM_OMNI_STUB_JOBS_FILE", "").strip()
    if jobs_file:
        logging.getLogger("uvicorn.access").addFilter(JobCounter(jobs_file))
    sys.argv = ["vllm", *ARGV]
    result = vllm_main()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
