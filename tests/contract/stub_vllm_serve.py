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
  output, as in ``UniProcDiffusionExecutor.execute_request``.
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
import signal  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import upstream  # noqa: E402
import upstream_lines  # noqa: E402

upstream.server_python_ok()


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    return float(raw) if raw.strip() else default


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else None


@dataclass(frozen=True)
class Knobs:
    load_delay_s: float
    step_s: float
    oom_at_load: bool
    oom_unless: tuple[str, ...]
    oom_in_job: int | None
    crash_after_jobs: int | None
    hang_after_jobs: int | None
    hang_in_job: bool
    fault_grace_s: float

    @classmethod
    def from_env(cls) -> "Knobs":
        unless = tuple(f.strip() for f in os.environ.get("VLLM_OMNI_STUB_OOM_UNLESS", "").split(",") if f.strip())
        return cls(
            load_delay_s=_env_float("VLLM_OMNI_STUB_LOAD_DELAY_S", 0.0),
            step_s=_env_float("VLLM_OMNI_STUB_STEP_S", 0.02),
            oom_at_load=os.environ.get("VLLM_OMNI_STUB_OOM_AT_LOAD", "").strip() not in ("", "0"),
            oom_unless=unless,
            oom_in_job=_env_int("VLLM_OMNI_STUB_OOM_IN_JOB"),
            crash_after_jobs=_env_int("VLLM_OMNI_STUB_CRASH_AFTER_JOBS"),
            hang_after_jobs=_env_int("VLLM_OMNI_STUB_HANG_AFTER_JOBS"),
            hang_in_job=os.environ.get("VLLM_OMNI_STUB_HANG_IN_JOB", "").strip() not in ("", "0"),
            fault_grace_s=_env_float("VLLM_OMNI_STUB_FAULT_GRACE_S", 1.0),
        )

    def oom_at_load_now(self, argv: list[str]) -> bool:
        if self.oom_at_load:
            return True
        if not self.oom_unless:
            return False
        present = {arg.split("=", 1)[0] for arg in argv}
        return not any(flag in present for flag in self.oom_unless)


KNOBS = Knobs.from_env()
ARGV = sys.argv[1:]

# Job storage: a private directory unless the caller chose one (upstream default /tmp/storage).
if not os.environ.get("VLLM_OMNI_SERVER_STORAGE__PATH") and not os.environ.get("VLLM_OMNI_STORAGE_PATH"):
    os.environ["VLLM_OMNI_SERVER_STORAGE__PATH"] = upstream.make_temp_dir("storage")
STORAGE_DIR = os.environ.get("VLLM_OMNI_SERVER_STORAGE__PATH") or os.environ.get("VLLM_OMNI_STORAGE_PATH")

upstream.snapshot_hardware()
upstream.prepare_process_env()

with upstream.collector_paused():   # the imports of vLLM, without garbage-collector passes
    from vllm.entrypoints.cli.main import main as vllm_main  # (what the `vllm` script runs)

    upstream.install_fixture_hub()
    upstream.install_device_inventory()

    import numpy as np
    import torch
    from vllm.v1.engine.exceptions import EngineDeadError
    from vllm_omni.diffusion.data import DiffusionOutput
    from vllm_omni.diffusion.executor.abstract import DiffusionExecutor
    from vllm_omni.diffusion.media import (
        DiffusionMediaOutput,
        VideoMediaOutput,
        VideoTensorEncoding,
        VideoTensorLayout,
        VideoTensorSpec,
        VideoValueRange,
    )

import frame_code  # noqa: E402

GiB = 1 << 30
CUDA_OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.55 GiB of which "
    "1.02 GiB is free. Including non-PyTorch memory, this process has 22.52 GiB memory in use. Of the "
    "allocated memory 21.80 GiB is allocated by PyTorch, and 312.45 MiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
    "Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html"
    "#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
)
INVALID_DEVICE_MESSAGE = (
    "CUDA error: invalid device ordinal\n"
    "GPU device may be out of range, do you have enough GPUs?\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
    "might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)
I2V_CLASSES = {"WanImageToVideoPipeline", "WanI2VDMD2Pipeline"}
WAN_CLASSES = {"WanPipeline", "WanDMDPipeline", "WanT2VDMD2Pipeline"} | I2V_CLASSES


# --------------------------------------------------------------------------- worker-side logging
# Every upstream line this stub prints is looked up in the installed upstream at start: a copy that
# upstream no longer logs fails the start here, not a parser test later (upstream_lines.py).
_UPSTREAM = upstream_lines.Finder()
try:
    _UPSTREAM.check(upstream_lines.installed_version())
except upstream_lines.MissingUpstreamLine as missing:
    sys.stderr.write(f"stub_vllm_serve.py: {missing}\n")
    raise SystemExit(3) from None


class WorkerLog:
    """Log records that look as if the real worker module had emitted them.

    ``separate_process`` mimics worker processes of the multi-process executor: their
    output carries no ``(APIServer pid=...)`` prefix, so it bypasses the decorated write.
    """

    def __init__(self, separate_process: bool) -> None:
        self.separate_process = separate_process

    def emit(self, key: str, level: int, *args: object) -> None:
        """Log upstream's line `key` (upstream_lines.LINES) with `args`, from the line of the real
        module's logging call; a line the installed upstream does not log raises MissingUpstreamLine."""
        line = upstream_lines.LINES[key]
        lineno = _UPSTREAM.line_of(line.module, line.message)
        mod = sys.modules.get(line.module)
        path = getattr(mod, "__file__", None) or upstream_lines.module_file(line.module)
        logger = logging.getLogger(line.module)
        if not logger.isEnabledFor(level):
            return
        record = logger.makeRecord(logger.name, level, path, lineno, line.message, args, None)
        if not self.separate_process:
            logger.handle(record)
            return
        node: logging.Logger | None = logger
        while node is not None:
            for handler in node.handlers:
                if record.levelno >= handler.level and hasattr(handler, "stream"):
                    stream = handler.stream
                    write = getattr(stream, "_original_write", stream.write)
                    write(handler.format(record) + "\n")
                    stream.flush()
                    return
            node = node.parent if node.propagate else None

    def raw_stderr(self):
        """stderr as a worker process would own it (undecorated)."""
        if not self.separate_process or not hasattr(sys.stderr, "_original_write"):
            return sys.stderr
        stream = sys.stderr

        class _Raw:
            def write(self, s: str) -> int:
                stream._original_write(s)
                return len(s)

            def flush(self) -> None:
                stream.flush()

            def isatty(self) -> bool:
                return stream.isatty()

            encoding = getattr(stream, "encoding", "utf-8")

        return _Raw()


# --------------------------------------------------------------------------- model facts
@dataclass
class ModelFacts:
    class_name: str | None
    is_wan: bool
    is_i2v: bool
    is_dmd: bool
    spatial: int          # vae scale_factor_spatial
    temporal: int         # vae scale_factor_temporal
    patch: int            # transformer patch_size[1]
    transformers: tuple[str, ...]
    dit_bytes: int        # bf16 bytes of the DiT expert(s) the pipeline loads
    text_encoder_bytes: int
    vae_bytes: int
    num_shards: int

    def gpu_bytes(self, od_config, world_size: int) -> int:
        """Rough per-GPU weight footprint, for the ``Model loading took`` line."""
        pc = od_config.parallel_config
        dit = self.dit_bytes / max(1, int(getattr(pc, "tensor_parallel_size", 1) or 1))
        if getattr(pc, "use_hsdp", False):
            shard = int(getattr(pc, "hsdp_shard_size", -1) or -1)
            dit /= shard if shard > 0 else max(1, world_size)
        te = self.text_encoder_bytes
        if getattr(od_config, "enable_layerwise_offload", False):
            dit *= 0.05
        if getattr(od_config, "enable_cpu_offload", False):
            te = 0
        return int(dit + te + self.vae_bytes)

    @classmethod
    def load(cls, od_config) -> "ModelFacts":
        from vllm_omni.diffusion.utils.hf_utils import get_diffusion_model_index
        from vllm.transformers_utils.config import get_hf_file_to_dict

        model = od_config.model
        class_name = getattr(od_config, "model_class_name", None)

        def cfg(name: str) -> dict:
            try:
                return get_hf_file_to_dict(name, model) or {}
            except Exception:
                return {}

        index = get_diffusion_model_index(model) or {}
        vae = cfg("vae/config.json")
        dits = []
        for comp in ("transformer", "transformer_2"):
            entry = index.get(comp)
            if isinstance(entry, list) and entry and entry[0] is None:
                continue
            conf = cfg(f"{comp}/config.json")
            if conf:
                dits.append((comp, conf))
        boundary = getattr(od_config, "boundary_ratio", None)
        if boundary == 1.0:
            dits = [d for d in dits if d[0] == "transformer_2"] or dits
        elif boundary == 0.0:
            dits = [d for d in dits if d[0] == "transformer"] or dits
        patch = 2
        dit_bytes = te_bytes = 0
        for _, conf in dits:
            p = conf.get("patch_size") or [1, 2, 2]
            patch = int(p[1]) if isinstance(p, (list, tuple)) and len(p) > 1 else 2
            d = int(conf.get("num_attention_heads", 1)) * int(conf.get("attention_head_dim", 64))
            ffn = int(conf.get("ffn_dim", 4 * d))
            layers = int(conf.get("num_layers", 1))
            dit_bytes += 2 * layers * (8 * d * d + 2 * d * ffn) + 2 * d * int(conf.get("text_dim", d))
        te = cfg("text_encoder/config.json")
        if te:
            dm, ff = int(te.get("d_model", 0)), int(te.get("d_ff", 0))
            inner = int(te.get("num_heads", 1)) * int(te.get("d_kv", 64))
            te_bytes = 2 * (int(te.get("num_layers", 0)) * (4 * dm * inner + 3 * dm * ff)
                            + int(te.get("vocab_size", 0)) * dm)
        return cls(
            class_name=class_name,
            is_wan=class_name in WAN_CLASSES,
            is_i2v=class_name in I2V_CLASSES,
            is_dmd=index.get("_class_name") == "WanDMDPipeline",
            spatial=int(vae.get("scale_factor_spatial") or 8),
            temporal=int(vae.get("scale_factor_temporal") or 4),
            patch=patch,
            transformers=tuple(name for name, _ in dits),
            dit_bytes=dit_bytes,
            text_encoder_bytes=te_bytes,
            # Wan2.1 VAE (base_dim 96) has ~127 M parameters; scale with the width
            vae_bytes=int(2 * 127_000_000 * (int(vae.get("base_dim", 96)) / 96) ** 2) if vae else 0,
            num_shards=max(1, len(dits)),
        )


# --------------------------------------------------------------------------- fault timing
class Faults:
    """Job counters and the post-job crash / hang triggers.

    A job has *started* when the engine hands it to the executor (the warm-up does not
    count).  An async job (``video_gen_*``) has *completed* once the API layer stored its
    MP4 (a job deleted while running never completes); any other request (``/sync``)
    completes when the executor returns its output.
    """

    lock = threading.Lock()
    started = 0
    completed = 0

    @classmethod
    def job_started(cls) -> int:
        with cls.lock:
            cls.started += 1
            return cls.started

    @classmethod
    def engine_finished(cls, request_id: str, executor: "StubGpuExecutor") -> None:
        if KNOBS.crash_after_jobs is None and KNOBS.hang_after_jobs is None:
            return
        threading.Thread(target=cls._watch, args=(request_id, executor), daemon=True,
                         name="stub-job-watch").start()

    @classmethod
    def _watch(cls, request_id: str, executor: "StubGpuExecutor") -> None:
        if request_id.startswith("video_gen_") and STORAGE_DIR:
            video_id = request_id.rsplit("-", 1)[0]
            path = os.path.join(STORAGE_DIR, video_id)
            deadline = time.monotonic() + 120.0
            while not os.path.exists(path):
                if time.monotonic() > deadline:
                    return  # deleted / aborted / never stored: not a completed job
                time.sleep(0.05)
        with cls.lock:
            cls.completed += 1
            n = cls.completed
        for limit, action in ((KNOBS.crash_after_jobs, crash), (KNOBS.hang_after_jobs, hang_api_server)):
            if limit is not None and n == limit:
                time.sleep(KNOBS.fault_grace_s)
                action(executor)


def _kill_children() -> None:
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except Exception:
                pass
    except Exception:
        pass


def crash(executor: "StubGpuExecutor") -> None:
    """The engine dies: worker failure lines, failure callbacks, EngineDeadError, exit 1."""
    log = executor.log
    try:
        if executor.separate_workers:
            log.emit("workers_died", logging.ERROR,
                     [f"DiffusionWorker-{r}(exitcode=-9, SIGKILL)" for r in range(executor.world_size)])
        else:
            log.emit("device_unusable", logging.ERROR, "CUDA error: an illegal memory access was encountered")
            log.emit("worker_dead", logging.ERROR)
        executor.mark_failed()
        sys.stderr.write("".join(traceback.format_exception_only(EngineDeadError())))
        sys.stderr.flush()
        sys.stdout.flush()
    finally:
        _kill_children()
        upstream.remove_temp_dirs()
        os._exit(1)


def hang_api_server(executor: "StubGpuExecutor | None" = None) -> None:
    """Block the API server's event loop (the one running on the main thread) forever."""
    import asyncio
    import gc

    scheduled = False
    for obj in gc.get_objects():
        try:
            if isinstance(obj, asyncio.AbstractEventLoop) and obj.is_running():
                obj.call_soon_threadsafe(_block_if_main_thread)
                scheduled = True
        except Exception:
            continue
    if not scheduled:  # no loop found: stop the whole process instead (also "alive but silent")
        os.kill(os.getpid(), signal.SIGSTOP)


def _block_if_main_thread() -> None:
    if threading.current_thread() is threading.main_thread():
        while True:
            time.sleep(3600)


# --------------------------------------------------------------------------- the fake GPU
class _Stalled(Exception):
    pass


class StubGpuExecutor(DiffusionExecutor):
    """A ``DiffusionExecutor`` whose workers are simulated in-process (see module doc)."""

    uses_multiproc = False
    upstream_class: type | None = None  # set by upstream.install_executor

    # -- lifecycle --------------------------------------------------------------------
    def _init_executor(self) -> None:
        od = self.od_config
        real = type(self).upstream_class
        self._closed = False
        self._is_failed = False
        self._failure_callbacks: list = []
        self.world_size = int(od.parallel_config.world_size)
        real_name = getattr(real, "__name__", "")
        num_gpus = od.num_gpus or 1
        if real_name == "UniProcDiffusionExecutor" and num_gpus != 1:
            # UniProcDiffusionExecutor._init_executor rejects this before creating its worker.
            raise ValueError(
                f"UniProcDiffusionExecutor supports a single GPU only, got num_gpus={num_gpus}. "
                'Use distributed_executor_backend="mp" for multi-GPU deployments.'
            )
        self.separate_workers = bool(getattr(real, "uses_multiproc", False)) or real_name.startswith("Multiproc")
        self.log = WorkerLog(self.separate_workers)
        self.facts = ModelFacts.load(od)
        self.devices = upstream.stage_devices(self.world_size)
        missing = upstream.missing_devices(self.world_size)
        if missing:
            # What torch.cuda.set_device() raises in a worker bound to a GPU the machine lacks.
            raise torch.AcceleratorError(INVALID_DEVICE_MESSAGE)
        self._load_workers()

    def _load_workers(self) -> None:
        od, log, facts = self.od_config, self.log, self.facts
        ranks = range(self.world_size) if self.separate_workers else range(1)
        for rank in ranks:
            log.emit("worker_initialized", logging.INFO, rank)
        t0 = time.perf_counter()
        if facts.is_wan:
            from vllm_omni.diffusion.model_loader.hub_prefetch import prefetch_subfolders

            prefetch_subfolders(od.model, ["tokenizer", "text_encoder", "vae"],
                                local_files_only=os.path.exists(od.model))
        if KNOBS.oom_at_load_now(ARGV):
            # A weight tensor allocation on the device fails during load_model().
            raise torch.OutOfMemoryError(CUDA_OOM_MESSAGE)
        t_weights = time.perf_counter()
        self._shard_progress(facts.num_shards)
        if KNOBS.load_delay_s > 0:
            time.sleep(KNOBS.load_delay_s)
        gib = facts.gpu_bytes(od, self.world_size) / GiB
        for rank in ranks:
            log.emit("weights_loaded", logging.INFO, time.perf_counter() - t_weights)
            log.emit("model_loaded_size", logging.INFO, gib, time.perf_counter() - t0)
            log.emit("model_loaded", logging.INFO)
            if not getattr(od, "enforce_eager", False):
                for attr in facts.transformers:
                    log.emit("lazy_compile", logging.INFO,
                             attr, getattr(od, "diffusion_compile_granularity", "regional"),
                             getattr(od, "diffusion_compile_dynamic", True))
            log.emit("runner_ready", logging.INFO)
            log.emit("worker_ready", logging.INFO, rank)

    def _shard_progress(self, shards: int) -> None:
        from tqdm import tqdm
        from vllm.model_executor.model_loader.weight_utils import _BAR_FORMAT

        with tqdm(total=shards, desc="Multi-thread loading shards", bar_format=_BAR_FORMAT,
                  file=self.log.raw_stderr()) as bar:
            for _ in range(shards):
                bar.update()

    @property
    def is_dead(self) -> bool:
        return self._closed or self._is_failed

    def register_failure_callback(self, callback) -> None:
        self._failure_callbacks.append(callback)

    def mark_failed(self) -> None:
        if self._is_failed:
            return
        self._is_failed = True
        for callback in list(self._failure_callbacks):
            try:
                callback()
            except Exception:
                pass

    def check_health(self) -> None:
        if self._is_failed:
            raise EngineDeadError()
        if self._closed:
            raise RuntimeError("DiffusionExecutor is closed.")

    def shutdown(self) -> None:
        self._closed = True

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, unique_reply_rank=None,
                       exec_all_ranks=False):
        if self._closed:
            raise RuntimeError("DiffusionExecutor is closed.")
        results = {"list_loras": [], "add_lora": True, "remove_lora": True, "pin_lora": True,
                   "synchronize_device": None, "profile": None}
        if method not in results:
            raise NotImplementedError(f"stub GPU executor does not implement collective_rpc({method!r})")
        result = results[method]
        return result if unique_reply_rank is not None else [result] * (self.world_size if exec_all_ranks else 1)

    # -- execution --------------------------------------------------------------------
    def execute_request(self, scheduler_output):
        from vllm_omni.diffusion.worker.utils import BatchRunnerOutput, RunnerOutput

        if self._closed:
            raise RuntimeError("DiffusionExecutor is closed.")
        outputs = []
        for new_req in scheduler_output.scheduled_new_reqs:
            outputs.append(RunnerOutput(request_id=new_req.request_id, step_index=None, finished=True,
                                        result=self._run_request(new_req.req)))
        return BatchRunnerOutput.from_list(outputs)

    execute_batch = execute_request

    def execute_step(self, scheduler_output):
        raise RuntimeError("stub GPU executor: Wan pipelines have no step execution")

    def _run_request(self, req) -> DiffusionOutput:
        dummy = req.is_dummy_run()
        job = None if dummy else Faults.job_started()
        try:
            media, peak = self._forward(req, job)
        except _Stalled:
            return DiffusionOutput(error="DiffusionEngine is closed.")
        except Exception as exc:
            # UniProcDiffusionExecutor.execute_request: the worker's exception becomes the
            # request's error output (the engine then raises it as RuntimeError).
            return DiffusionOutput(error=str(exc))
        if not dummy:
            Faults.engine_finished(req.request_id, self)
        return DiffusionOutput(media=media, peak_memory_mb=peak)

    def _forward(self, req, job: int | None):
        from vllm_omni.diffusion.models.progress_bar import ProgressBarMixin
        from vllm_omni.diffusion.postprocess.device_reduction import prepare_diffusion_media_for_transport

        facts, od, sp = self.facts, self.od_config, req.sampling_params
        prompt = req.prompt
        text = prompt if isinstance(prompt, str) else (prompt.get("prompt") or "")
        height = sp.height or 480
        width = sp.width or 832
        num_frames = sp.num_frames or 81
        steps = 40 if sp.num_inference_steps is None else sp.num_inference_steps
        if facts.is_wan:
            from vllm_omni.diffusion.models.wan2_2.pipeline_wan2_2 import (
                resolve_wan_flow_shift,
                resolve_wan_guidance_scales,
                resolve_wan_sample_solver,
            )

            if not text:
                raise ValueError("Prompt is required for Wan2.2 I2V generation when prompt_embeds are not provided."
                                 if facts.is_i2v else
                                 "Prompt is required for Wan2.2 generation when prompt_embeds are not provided.")
            if facts.is_i2v:
                mm = {} if isinstance(prompt, str) else (prompt.get("multi_modal_data") or {})
                if mm.get("image") is None:
                    raise ValueError("Image is required for I2V generation.")
                if height % 16 != 0 or width % 16 != 0:
                    raise ValueError(f"`height` and `width` have to be divisible by 16 but are {height} and {width}.")
            else:
                mod = facts.spatial * facts.patch
                height, width = height // mod * mod, width // mod * mod
            if facts.is_dmd:
                steps = 3
            resolve_wan_guidance_scales(sp, default_guidance_scale=5.0 if facts.is_i2v else 4.0)
            if od.boundary_ratio is None and sp.boundary_ratio is None:
                self.log.emit("boundary_ratio_i2v" if facts.is_i2v else "boundary_ratio_t2v", logging.WARNING)
            if num_frames % facts.temporal != 1:
                num_frames = num_frames // facts.temporal * facts.temporal + 1
            num_frames = max(num_frames, 1)
            if not facts.is_dmd:
                resolve_wan_sample_solver(req)
                resolve_wan_flow_shift(req, od)
        if height <= 0 or width <= 0:
            raise RuntimeError(f"Calculated latent size is zero for height={height}, width={width}")
        seed = sp.seed if sp.seed is not None else 0
        batch = max(1, int(getattr(sp, "num_outputs_per_prompt", None) or 1))

        bar_owner = ProgressBarMixin()
        bar_owner.set_progress_bar_config(file=self.log.raw_stderr())
        per_request = getattr(sp, "extra_args", None) or {}   # the request's extra_params
        stall_at = min(1, steps - 1) if job is not None and (KNOBS.hang_in_job or per_request.get("stub_hang")) \
            else None
        oom_at = steps // 2 if job is not None and (KNOBS.oom_in_job == job or per_request.get("stub_oom")) \
            else None
        with bar_owner.progress_bar(total=steps) as pbar:
            for step in range(steps):
                if stall_at is not None and step == stall_at:
                    pbar.refresh()  # the last finished step stays on screen, then nothing
                    while not self._closed:
                        time.sleep(0.05)
                    raise _Stalled()
                if oom_at is not None and step == oom_at:
                    raise torch.OutOfMemoryError(CUDA_OOM_MESSAGE)
                if KNOBS.step_s > 0:
                    time.sleep(KNOBS.step_s)
                if self._closed:
                    raise _Stalled()
                pbar.update()

        frames = np.stack([frame_code.encode(i, seed, width, height) for i in range(num_frames)])
        video = torch.from_numpy(frames).permute(3, 0, 1, 2).unsqueeze(0).float().div_(127.5).sub_(1.0)
        video = video.to(torch.bfloat16).expand(batch, -1, -1, -1, -1).contiguous()
        media = DiffusionMediaOutput(video=VideoMediaOutput(
            tensor=video,
            spec=VideoTensorSpec(layout=VideoTensorLayout.BCTHW, encoding=VideoTensorEncoding.NORMALIZED_FLOAT,
                                 value_range=VideoValueRange.NEGATIVE_ONE_TO_ONE),
        ))
        media = prepare_diffusion_media_for_transport(media, od_config=od, sampling_params=sp)
        peak_mb = (self.facts.gpu_bytes(od, self.world_size) + video.numel() * 8) / (1 << 20)
        return media, peak_mb


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
