#!/usr/bin/env python3
"""Batch resolver: what would the real ``vllm serve ... --omni`` (0.30) resolve or refuse?

Run with the server python::

    echo '[{"argv": ["serve", "Wan-AI/Wan2.2-T2V-A14B-Diffusers", "--omni", "--usp", "2"],
            "visible_devices": 2}]' | python tests/contract/upstream_resolve.py

Input (stdin): a JSON list of cases ``{"argv": [...], "visible_devices": N}``.  ``argv`` is
what the ``vllm`` program gets (starting with ``serve``).  ``visible_devices`` is either an
int N (``CUDA_VISIBLE_DEVICES`` unset, N devices present) or a string such as ``"2,3"``
(used as ``CUDA_VISIBLE_DEVICES``); default 1.  Optional ``"env": {...}`` adds environment
variables for that case.

Output (stdout): a JSON list, one result per case, in order:

* ``{"ok": true, "config": {...}}`` with the resolved diffusion config (see
  ``summarize_od_config``: world_size, parallel degrees, offload, quantization,
  tiling, cache backend, enforce_eager, boundary_ratio, flow_shift, devices, ...);
* ``{"ok": false, "stage": "parse", "error": "...", "exit_code": 2}`` when argparse refuses
  the command line (``error`` is argparse's message, e.g. ``unrecognized arguments: ...``)
  or ``OmniServeCommand.validate`` raises (``exit_code`` 1);
* ``{"ok": false, "stage": "resolve", "error": "...", "error_type": "ValueError",
  "top_error": "..."}`` when startup fails before the GPU workers would start (``error``
  is the root cause's message, ``top_error`` what the server's last traceback line shows).

Every case runs the same code as ``stub_vllm_serve.py`` up to the executor:
``vllm.entrypoints.cli.main.main`` -> omni CLI -> ``OmniServeCommand.validate`` / ``cmd``
-> ``build_async_omni`` -> ``AsyncOmni`` -> ... -> ``build_diffusion_config`` ->
``InlineStageDiffusionClient`` -> ``DiffusionEngine``, whose executor
(``upstream.CaptureExecutor``) returns the config instead of starting workers.  The only
resolver-specific shim: ``omni_run_server`` is replaced by a coroutine that calls the real
``validate_api_server_args`` and ``build_async_omni`` but does not bind the HTTP port or
decorate stdout (so hundreds of cases can run in one process).  Stages that upstream
runs in a subprocess (``num_replicas > 1``) are captured where ``StageDiffusionProcManager``
would spawn it (the first replica's config is reported).  Logs go to /dev/null unless
``--verbose`` is given (then to stderr).

``--serve``: instead of one batch, answer batches for as long as stdin stays open: each
input line is a JSON list of cases, each output line the JSON list of their results (the
tests keep one such process for the whole session, so vLLM is imported once).

A case ``{"call": "module:function", "input": ...}`` instead runs a server-side probe of
the tests in this process (a module next to this file, e.g. ``replica_probe``: it checks
what the cases above cannot see, and must put back what it replaces); its result is
the function's return value, or ``{"call_error": "<traceback>"}``.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import sys
import traceback
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import upstream  # noqa: E402

upstream.server_python_ok()


class _ShimReached(Exception):
    pass


# --------------------------------------------------------------------------- config summary
def summarize_od_config(od_config: Any, devices: list[str], missing: list[str] | None = None) -> dict[str, Any]:
    """The resolved diffusion config as plain JSON (the fields the launcher cares about)."""
    pc = od_config.parallel_config
    quant = getattr(od_config, "quantization_config", None)
    quant_name = None
    if quant is not None:
        get_name = getattr(quant, "get_name", None)
        quant_name = get_name() if callable(get_name) else getattr(quant, "method", None) or type(quant).__name__
        quant_name = str(quant_name)
    offload = getattr(od_config, "diffusion_offload_config", None) or getattr(od_config, "offload_config", None)

    def plain(value: Any) -> Any:
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple, set)):
            return [plain(v) for v in value]
        if hasattr(value, "value") and isinstance(getattr(value, "value"), (str, int)):
            return value.value
        return str(value)

    return {
        "model": od_config.model,
        "model_class_name": getattr(od_config, "model_class_name", None),
        "world_size": pc.world_size,
        "tensor_parallel_size": pc.tensor_parallel_size,
        "ulysses_degree": pc.ulysses_degree,
        "ring_degree": pc.ring_degree,
        "sequence_parallel_size": getattr(pc, "sequence_parallel_size", None),
        "cfg_parallel_size": pc.cfg_parallel_size,
        "vae_patch_parallel_size": getattr(pc, "vae_patch_parallel_size", None),
        "data_parallel_size": getattr(pc, "data_parallel_size", None),
        "pipeline_parallel_size": getattr(pc, "pipeline_parallel_size", None),
        "use_hsdp": getattr(pc, "use_hsdp", None),
        "hsdp_shard_size": getattr(pc, "hsdp_shard_size", None),
        "hsdp_replicate_size": getattr(pc, "hsdp_replicate_size", None),
        "enable_cpu_offload": bool(getattr(od_config, "enable_cpu_offload", False)),
        "enable_layerwise_offload": bool(getattr(od_config, "enable_layerwise_offload", False)),
        "offload_config": plain(offload),
        "quantization": quant_name,
        "vae_use_tiling": getattr(od_config, "vae_use_tiling", None),
        "vae_use_slicing": getattr(od_config, "vae_use_slicing", None),
        "cache_backend": plain(getattr(od_config, "cache_backend", None)),
        "enforce_eager": getattr(od_config, "enforce_eager", None),
        "boundary_ratio": getattr(od_config, "boundary_ratio", None),
        "flow_shift": getattr(od_config, "flow_shift", None),
        "lora_path": plain(getattr(od_config, "lora_path", None)),
        "lora_backend": plain(getattr(od_config, "lora_backend", None)),
        "lora_scale": getattr(od_config, "lora_scale", None),
        "dtype": plain(getattr(od_config, "dtype", None)),
        "max_num_seqs": getattr(od_config, "max_num_seqs", None),
        "distributed_executor_backend": plain(getattr(od_config, "distributed_executor_backend", None)),
        "num_gpus": getattr(od_config, "num_gpus", None),
        "devices": devices,
        # devices the ranks would bind that the (fake) machine does not have: the real
        # server accepts this layout at config time and its workers then fail to start
        "missing_devices": list(missing or []),
    }


def root_cause(exc: BaseException) -> BaseException:
    """The exception a ``raise X from exc`` chain wraps (follows ``__cause__`` only).

    Upstream wraps stage-init failures as ``RuntimeError("Orchestrator initialization
    failed: ...") from exc``; the wrapped exception carries the real message.  Implicit
    contexts (an error raised while handling another) are not followed: there the newer
    exception is the one upstream means to report (e.g. ``Repository not found``).
    """
    seen = set()
    while id(exc) not in seen and exc.__cause__ is not None:
        seen.add(id(exc))
        exc = exc.__cause__
    return exc


def _setup():
    upstream.prepare_process_env()
    with upstream.collector_paused():   # the imports of vLLM, without garbage-collector passes
        from vllm.entrypoints.cli.main import main as vllm_main

        upstream.install_fixture_hub()
        upstream.install_device_inventory()
        upstream.install_executor(upstream.make_capture_executor())

        import vllm_omni.entrypoints.cli.serve as omni_serve
        from vllm.entrypoints.launchers.launcher import validate_api_server_args
        from vllm_omni.entrypoints.openai.api_server import build_async_omni

    state = {"in_resolve": False}

    async def resolve_only(args, **_uvicorn_kwargs):
        state["in_resolve"] = True
        validate_api_server_args(args)
        async with build_async_omni(args):
            pass  # not reached: CaptureExecutor raises ResolvedConfig during startup
        raise RuntimeError("startup finished without reaching the diffusion executor")

    omni_serve.omni_run_server = resolve_only

    # Stages that upstream runs in their own process (``num_replicas > 1``, multi-stage
    # pipelines) get their config in this process and then spawn StageDiffusionProc:
    # stop there the same way.
    from vllm_omni.diffusion.stage_diffusion_proc import StageDiffusionProcManager

    def capture_proc_config(self, model, od_config, *args, **kwargs):
        world = od_config.parallel_config.world_size
        raise upstream.ResolvedConfig(od_config, upstream.stage_devices(world), upstream.missing_devices(world))

    StageDiffusionProcManager.__init__ = capture_proc_config
    return vllm_main, state


def _case_env(case: dict) -> dict[str, str]:
    env = {k: str(v) for k, v in (case.get("env") or {}).items()}
    visible = case.get("visible_devices", 1)
    if isinstance(visible, str):
        env["CUDA_VISIBLE_DEVICES"] = visible
    else:
        env["__UNSET__CUDA_VISIBLE_DEVICES"] = "1"
        env["VLLM_OMNI_STUB_DEVICE_COUNT"] = str(int(visible))
    return env


def run_call(case: dict) -> object:
    """A ``{"call": "module:function", "input": ...}`` case: that function of a test module."""
    module, _, function = case["call"].partition(":")
    try:
        return getattr(importlib.import_module(module), function)(case.get("input"))
    except Exception:  # noqa: BLE001 - the test shows it; the process goes on serving
        return {"call_error": traceback.format_exc()}


def run_case(vllm_main, state, case: dict) -> dict:
    if "call" in case:
        return run_call(case)
    argv = [str(a) for a in case.get("argv", [])]
    saved_env = dict(os.environ)
    saved_argv = sys.argv
    for key, value in _case_env(case).items():
        if key.startswith("__UNSET__"):
            os.environ.pop(key[len("__UNSET__"):], None)
        else:
            os.environ[key] = value
    state["in_resolve"] = False
    upstream.snapshot_hardware()
    err = io.StringIO()
    try:
        sys.argv = ["vllm", *argv]
        with contextlib.redirect_stderr(err):
            vllm_main()
        return {"ok": False, "stage": "parse", "error": "command did not start a server", "exit_code": 0}
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        text = err.getvalue().strip().splitlines()
        last = text[-1] if text else ""
        message = last.split("error: ", 1)[1] if "error: " in last else last
        return {"ok": False, "stage": "parse", "error": message, "exit_code": code}
    except BaseException as exc:  # noqa: BLE001 - report every startup failure
        cause = root_cause(exc)
        if isinstance(cause, upstream.ResolvedConfig):
            return {"ok": True, "config": summarize_od_config(cause.od_config, cause.devices, cause.missing)}
        if isinstance(exc, KeyboardInterrupt):
            raise
        return {
            "ok": False,
            "stage": "resolve" if state["in_resolve"] else "parse",
            "error": str(cause),
            "error_type": type(cause).__name__,
            "top_error": f"{type(exc).__name__}: {exc}",
            "exit_code": 1,
        }
    finally:
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)


def _cases(text: str) -> list[dict]:
    cases = json.loads(text)
    if not isinstance(cases, list):
        raise SystemExit("stdin must be a JSON list of cases")
    return cases


def main() -> int:
    verbose = "--verbose" in sys.argv[1:]
    serve = "--serve" in sys.argv[1:]
    batch = None if serve else _cases(sys.stdin.read())
    out = os.fdopen(os.dup(1), "w")
    sink = os.open(os.devnull, os.O_WRONLY)
    # Upstream logs (and anything else) must not corrupt the JSON on stdout.
    os.dup2(2 if verbose else sink, 1)
    if not verbose:
        os.dup2(sink, 2)
    vllm_main, state = _setup()
    if batch is not None:
        json.dump([run_case(vllm_main, state, case) for case in batch], out, indent=1)
        out.write("\n")
        out.flush()
    else:
        for line in sys.stdin:
            if line.strip():
                json.dump([run_case(vllm_main, state, case) for case in _cases(line)], out)
                out.write("\n")
                out.flush()
    # Skip interpreter teardown of upstream background threads (atexit would not run).
    upstream.remove_temp_dirs()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
