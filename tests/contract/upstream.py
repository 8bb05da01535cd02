"""Seams into the real vLLM-Omni 0.30 code, shared by the stub server and the resolver.

Runs only under the *server* python (the venv that has ``vllm`` and ``vllm-omni``).
``stub_vllm_serve.py`` and ``upstream_resolve.py`` import this module; it never
copies upstream logic, it only replaces what a CPU-only CI machine does not have:

1. The Hugging Face Hub (download seam, fixture_hub.py).  ``huggingface_hub.set_client_factory`` (the
   library's own hook for custom HTTP clients) gets an ``httpx`` client whose transport
   is :class:`FixtureHub`: a local, read-only Hub that serves the JSON files under
   ``fixtures/hf/<org>/<repo>/`` with the Hub's API shapes (``/api/models/<id>/revision``,
   ``/api/models/<id>/tree``, ``HEAD``/``GET /<id>/resolve/<rev>/<file>``) and answers
   every other repository with the Hub's 401 ``X-Error-Code: RepoNotFound``.  Everything
   above the HTTP transport is upstream code: ``huggingface_hub``'s download and cache
   (into a private ``HF_HUB_CACHE`` per process), vLLM-Omni's ``omni_snapshot_download``,
   ``is_diffusion_model``, the pipeline registry, ``resolve_omni_config``...  The model
   id therefore stays ``Wan-AI/...`` everywhere (served name, logs), exactly as on a
   machine that downloads it, and an unknown id fails with upstream's own
   ``Repository not found for '<id>'`` path.
2. The device inventory (hardware seam).  ``vllm_omni.platforms.current_omni_platform``
   keeps its class (CPU machine: ``UnspecifiedOmniPlatform``) but reports what a CUDA
   platform reports for device visibility: ``device_control_env_var =
   "CUDA_VISIBLE_DEVICES"``, ``device_name = "cuda"`` and ``get_device_count() =`` the
   number of ids in ``CUDA_VISIBLE_DEVICES`` (or ``VLLM_OMNI_STUB_DEVICE_COUNT``, default
   1, when that variable is unset), which is what ``build_diffusion_config`` reads for its
   device check.  :func:`snapshot_hardware` records those GPUs as the fake machine's, so
   a layout that binds other GPUs can be reported (resolver) or refused at worker start
   (stub) like CUDA's ``invalid device ordinal``.
3. The diffusion executor (GPU seam).  ``DiffusionExecutor.get_class`` still runs (so an
   invalid ``--distributed-executor-backend`` fails as upstream) but returns the class
   the caller installs: the stub server's fake GPU executor, or the resolver's
   :class:`CaptureExecutor` which stops at the point where GPU workers would start and
   hands back the fully resolved ``OmniDiffusionConfig``.

Everything between the CLI and the executor is the real code path that ``vllm serve
MODEL --omni`` takes: ``vllm.entrypoints.cli.main`` -> ``vllm_omni.entrypoints.cli.main``
-> ``OmniServeCommand`` (parse + validate) -> ``omni_run_server`` -> ``AsyncOmni`` ->
``AsyncOmniEngine`` -> Orchestrator -> ``StageRuntime`` -> ``build_diffusion_config``
-> ``InlineStageDiffusionClient`` -> ``DiffusionEngine`` -> executor.

Call :func:`prepare_process_env` before importing anything from vllm / huggingface_hub,
and import vLLM inside :func:`collector_paused`.  Neither replaces upstream code; they make
a process that imports vLLM cheaper (it is the bulk of the test suite's CPU time): one
package index scan instead of two, no background CUDA builds by ``humming`` that cannot
succeed here, no garbage-collector passes over the imports.
Temporary directories (HF cache, job storage) are named ``vllm-omni-stub-<kind>-<pid>-*``;
they are removed at exit, and ones left by killed processes are swept at the next start.
"""
from __future__ import annotations

import atexit
import contextlib
import gc
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from fixture_hub import install_fixture_hub  # noqa: F401  (seam 1, the Hub: fixture_hub.py)


# --------------------------------------------------------------------------- environment
def visible_device_count(environ: dict[str, str] | None = None) -> int:
    """Devices this process may use, as the stub's fake hardware reports them.

    ``CUDA_VISIBLE_DEVICES`` wins (count of its comma-separated ids, so ``""`` is 0);
    when it is unset, ``VLLM_OMNI_STUB_DEVICE_COUNT`` (default 1).
    """
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([tok for tok in visible.split(",") if tok.strip()])
    return int(env.get("VLLM_OMNI_STUB_DEVICE_COUNT", "1"))


_TEMP_DIRS: list[str] = []
_TEMP_PREFIX = "vllm-omni-stub-"


def make_temp_dir(kind: str) -> str:
    """A private temporary directory, removed at exit (also by :func:`remove_temp_dirs`).

    Named ``vllm-omni-stub-<kind>-<pid>-*`` so a later process can sweep the ones left by
    a process that was SIGKILLed (:func:`sweep_stale_temp_dirs`).
    """
    path = tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{kind}-{os.getpid()}-")
    if not _TEMP_DIRS:
        atexit.register(remove_temp_dirs)
    _TEMP_DIRS.append(path)
    return path


def remove_temp_dirs() -> None:
    while _TEMP_DIRS:
        shutil.rmtree(_TEMP_DIRS.pop(), ignore_errors=True)


def sweep_stale_temp_dirs() -> None:
    """Remove temp dirs of stub/resolver processes that no longer exist."""
    import re

    root = Path(tempfile.gettempdir())
    for path in root.glob(f"{_TEMP_PREFIX}*"):
        m = re.match(rf"{_TEMP_PREFIX}[a-z]+-(\d+)-", path.name)
        if not m or not path.is_dir():
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except (PermissionError, OSError):
            pass


def _install_sigterm_cleanup() -> None:
    """Before uvicorn installs its handlers, SIGTERM kills the process (upstream: default
    action); remove our temp dirs first, then die of the same signal."""
    import signal

    def handler(signum, frame):
        remove_temp_dirs()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, handler)


def _compute_package_index_once() -> None:
    """Make ``importlib.metadata.packages_distributions()`` compute its answer once per process.

    transformers and diffusers each call it while they are imported, and each call stats
    every file of every installed distribution (about 2 s on a small CI box, so 4 s of
    every stub start).  The installed packages do not change while the process runs, so
    the second caller gets the same mapping (its own copy) without the second scan.  Only
    the standard library's bookkeeping is cached: upstream code runs unchanged.
    """
    import importlib.metadata

    compute = importlib.metadata.packages_distributions
    if getattr(compute, "_computed_once", False):
        return
    answer: dict[str, list[str]] = {}

    def packages_distributions() -> dict[str, list[str]]:
        if not answer:
            answer.update(compute())
        return {name: list(dists) for name, dists in answer.items()}

    packages_distributions._computed_once = True  # type: ignore[attr-defined]
    importlib.metadata.packages_distributions = packages_distributions


def prepare_process_env() -> str:
    """Environment for the fixture Hub; must run before vllm/huggingface_hub import.

    Returns the private Hugging Face hub cache directory (its ``HF_HOME`` is deleted at
    exit), so fixture downloads never touch the user's cache and no token is sent.
    """
    _compute_package_index_once()
    sweep_stale_temp_dirs()
    _install_sigterm_cleanup()
    home = make_temp_dir("hf")
    cache = os.path.join(home, "hub")
    os.environ["HF_HOME"] = home
    os.environ["HF_HUB_CACHE"] = cache
    os.environ.pop("HUGGINGFACE_HUB_CACHE", None)
    os.environ.pop("HF_TOKEN", None)
    # The fixture Hub is "online": offline switches would bypass it.
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.pop(name, None)
    os.environ.pop("HF_ENDPOINT", None)
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.pop("VLLM_USE_MODELSCOPE", None)
    _no_background_kernel_builds()
    return cache


@contextlib.contextmanager
def collector_paused():
    """Run the block (the imports of vLLM and vLLM-Omni) with Python's cyclic garbage
    collector off, then keep what it loaded out of later collections (``gc.freeze``) and
    turn the collector back on.

    Importing vLLM creates millions of long-lived objects (modules, classes, functions);
    with the collector on, its passes over that growing heap cost about a seventh of the
    import's CPU time (measured on 2 cores: 29.6 -> 25.3 CPU-s on average over three pairs
    of stub processes that import everything and exit at argparse).  The same code runs in
    the same order; only when the collector runs changes, and nothing imported is garbage.
    """
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def _no_background_kernel_builds() -> None:
    """Turn off the CUDA kernel pre-builds that ``humming`` (a kernel package vLLM imports)
    starts in the background when it is imported.

    ``import humming`` spawns two python processes that try to compile its CUDA launcher
    and NVRTC helper (``build_humming_launcher_in_bg``, ``build_nvrtc_compile_binary_in_bg``);
    on a machine without the CUDA toolkit they fail and cache nothing, so every process that
    imports vLLM paid about 8 CPU-seconds for them (each child re-imports torch), a fifth of
    a stub start.  ``HUMMING_DISABLE_PARALLEL_BUILD=1`` is humming's own switch for this (it
    sets it in those children itself); with it set the build happens on first use of a
    humming kernel, which the fake GPU never reaches.  Nothing else reads it (humming also
    builds kernels serially instead of on 16 threads, again only on a real GPU).  A value
    the caller set is kept.
    """
    os.environ.setdefault("HUMMING_DISABLE_PARALLEL_BUILD", "1")


# --------------------------------------------------------------------------- hardware
def install_device_inventory() -> None:
    """Make the omni platform report CUDA-style device visibility (see module doc)."""
    import vllm_omni.platforms as omni_platforms

    platform = omni_platforms.current_omni_platform
    base = type(platform)
    if getattr(base, "_stub_device_inventory", False):
        return

    class StubDeviceInventory(base):  # type: ignore[misc, valid-type]
        _stub_device_inventory = True
        device_control_env_var = "CUDA_VISIBLE_DEVICES"
        # what CudaPlatform reports; selects ``platforms: cuda:`` sections of deploy YAMLs
        device_name = "cuda"

        @classmethod
        def get_device_count(cls) -> int:
            return visible_device_count()

    StubDeviceInventory.__name__ = base.__name__
    StubDeviceInventory.__qualname__ = base.__qualname__
    platform.__class__ = StubDeviceInventory


# --------------------------------------------------------------------------- executor seam
def install_executor(executor_cls: type) -> None:
    """Make ``DiffusionExecutor.get_class`` validate as upstream, then return ``executor_cls``."""
    from vllm_omni.diffusion.executor.abstract import DiffusionExecutor

    real_get_class = getattr(DiffusionExecutor.get_class, "_stub_real", DiffusionExecutor.get_class)

    def get_class(od_config):
        real_cls = real_get_class(od_config)
        executor_cls.upstream_class = real_cls
        return executor_cls

    get_class._stub_real = real_get_class  # type: ignore[attr-defined]
    DiffusionExecutor.get_class = staticmethod(get_class)  # type: ignore[method-assign]


class ResolvedConfig(Exception):
    """Raised by :class:`CaptureExecutor` to hand the resolved config back."""

    def __init__(self, od_config: Any, devices: list[str], missing: list[str] | None = None) -> None:
        super().__init__("resolved")
        self.od_config = od_config
        self.devices = devices
        self.missing = missing or []


def stage_devices(world_size: int) -> list[str]:
    """Device ids the stage's ranks would bind: the first ``world_size`` visible ones.

    Read when the executor starts, i.e. inside upstream's per-stage device scope.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [t.strip() for t in visible.split(",") if t.strip()] if visible is not None \
        else [str(i) for i in range(visible_device_count())]
    return ids[:world_size]


_HARDWARE: list[str] = []


def snapshot_hardware() -> list[str]:
    """Record the fake machine's GPUs (call before upstream touches the environment).

    ``CUDA_VISIBLE_DEVICES=2,3`` means GPUs 2 and 3 exist; unset means GPUs
    ``0..VLLM_OMNI_STUB_DEVICE_COUNT-1``.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    _HARDWARE[:] = [t.strip() for t in visible.split(",") if t.strip()] if visible is not None \
        else [str(i) for i in range(visible_device_count())]
    return list(_HARDWARE)


def missing_devices(world_size: int) -> list[str]:
    """Ranks' devices the fake machine does not have (upstream can resolve such a layout:
    I2V-A14B's generic stage config with ``CUDA_VISIBLE_DEVICES`` unset; a real worker then
    fails with ``invalid device ordinal``)."""
    devices = stage_devices(world_size)
    missing = [d for d in devices if d not in _HARDWARE]
    missing += [f"rank{r}" for r in range(len(devices), world_size)]
    return missing


def make_capture_executor():
    from vllm_omni.diffusion.executor.abstract import DiffusionExecutor

    class CaptureExecutor(DiffusionExecutor):
        """Stops startup where the GPU workers would be created."""

        upstream_class: type | None = None

        def _init_executor(self) -> None:
            world = self.od_config.parallel_config.world_size
            raise ResolvedConfig(self.od_config, stage_devices(world), missing_devices(world))

        is_dead = True

        def execute_request(self, scheduler_output):  # pragma: no cover - never reached
            raise NotImplementedError

        execute_batch = execute_step = execute_request

        def collective_rpc(self, *a, **k):  # pragma: no cover
            raise NotImplementedError

        def check_health(self) -> None:  # pragma: no cover
            pass

        def shutdown(self) -> None:
            pass

    return CaptureExecutor


def server_python_ok() -> None:
    """Fail early with a clear message when run under a python without vllm-omni."""
    try:
        import importlib.util

        if importlib.util.find_spec("vllm_omni") is None or importlib.util.find_spec("vllm") is None:
            raise ImportError
    except ImportError:
        sys.stderr.write(f"{sys.executable} has no vllm/vllm_omni: run this with the server python "
                         "(VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON)\n")
        raise SystemExit(3)
