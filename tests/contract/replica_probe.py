"""Server side of tests/contract/test_replica_flags.py: vLLM-Omni 0.30's replica,
head/headless and request-batching knobs through the REAL parser and config resolution.

:func:`probe` runs inside ``upstream_resolve.py`` (server python), which calls it by name for
a case ``{"call": "replica_probe:probe", "input": {name: case}}``; the fixture Hub and the
device inventory (``upstream.py``) are installed there already.  For each case:

* the command line goes through upstream's own ``vllm_omni.entrypoints.cli.main.main``
  (argparse, ``OmniServeCommand.validate`` and ``.cmd``); what ``cmd`` dispatches to is
  replaced by functions that resolve the config the way the real command would and stop
  before any process, socket or GPU is started:
  - a head or single runtime (``omni_run_server``): ``prepare_stage_config_inputs`` ->
    ``resolve_omni_config`` -> ``create_stage_runtime`` (``DistStageRuntime`` when
    ``--stage-id`` is given, as ``AsyncOmniEngine`` does) -> the runtime's own replica-count
    step -> ``compute_replica_layout`` (replicas and the devices each one gets) ->
    ``build_diffusion_config`` (batch width, admission wait);
  - ``--headless``: the real ``run_headless``, with ``launch_headless_diffusion_replicas``
    replaced by a recorder of what it was asked to launch;
* request batching: upstream's ``build_request_batch_sampling_params_key`` (the scheduler's
  "may these requests share one forward" key) on requests that went through the real Wan
  pre-processing hook.

The entry points replaced per case are put back when :func:`probe` returns, so the
resolver's own cases that follow run as before.
"""
from __future__ import annotations

import os
import sys

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
I2V = "Wan-AI/Wan2.2-I2V-A14B-Diffusers"

REAL: dict = {}   # upstream functions the probe wraps (filled in probe)
ARG_KEYS = ("stage_id", "omni_master_address", "omni_master_port", "omni_replica_address", "omni_dp_size_local",
            "omni_lb_policy", "omni_heartbeat_timeout", "headless", "worker_backend", "ray_address",
            "max_num_seqs", "request_batch_max_wait_ms", "replica_id")


def _plain(value):
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def _resolve_runtime(args) -> dict:
    """What a head / single runtime would start: replica count, devices, batch settings."""
    from vllm_omni.config.resolver import resolve_omni_config
    from vllm_omni.engine.stage_init_utils import (
        build_diffusion_config, compute_replica_layout, extract_stage_metadata_from_omni_stage_config)
    from vllm_omni.engine.stage_runtime import create_stage_runtime
    from vllm_omni.entrypoints.utils import prepare_stage_config_inputs

    model = args.model
    inputs = prepare_stage_config_inputs(model, args.get_explicit_kwargs_dict(),
                                         trust_remote_code=getattr(args, "trust_remote_code", None) or None)
    resolved = resolve_omni_config(model, trust_remote_code=inputs.trust_remote_code, cli_overrides=inputs.kwargs,
                                   deploy_config_path=inputs.deploy_config_path,
                                   stage_overrides=inputs.stage_overrides,
                                   strategy_config_path=inputs.strategy_config_path)
    stage_configs = list(resolved.stage_configs)
    runtime = create_stage_runtime(
        stage_configs, model, resolved.config_path, single_stage_mode=args.stage_id is not None,
        stage_init_timeout=args.stage_init_timeout, async_chunk=False, single_stage_id_filter=args.stage_id,
        omni_master_address=args.omni_master_address, omni_master_port=args.omni_master_port,
        omni_dp_size_local=args.omni_dp_size_local, omni_heartbeat_timeout=args.omni_heartbeat_timeout,
        omni_lb_policy=args.omni_lb_policy)
    if args.stage_id is not None:
        # DistStageRuntime._prepare_stage_plans runs this before building the replica plans.
        runtime._validate_single_stage_mode_replica_constraints()
    replicas, devices = compute_replica_layout(stage_configs)
    stage = resolved.stage_by_id(0)
    od = build_diffusion_config(model, stage, extract_stage_metadata_from_omni_stage_config(stage))
    from vllm_omni.diffusion.diffusion_engine import supports_request_batch
    return {"runtime": type(runtime).__name__, "launch_mode": runtime._get_launch_mode(0),
            "replicas": replicas[0], "replica_devices": devices.get(0),
            "max_num_seqs": od.max_num_seqs, "request_batch_max_wait_ms": od.request_batch_max_wait_ms,
            "model_class_name": od.model_class_name, "supports_request_batch": supports_request_batch(od)}


def _run_headless(args) -> dict:
    """The real ``run_headless`` up to the point where it would spawn the replicas."""
    import vllm_omni.engine.stage_engine_startup as startup

    run_headless = REAL["run_headless"]

    seen: dict = {}

    def record(**kwargs):
        seen.update(omni_dp_size_local=kwargs["omni_dp_size_local"],
                    per_replica_devices=list(kwargs["per_replica_devices"]),
                    replica_bind_address=kwargs["replica_bind_address"],
                    master=f"{kwargs['omni_master_address']}:{kwargs['omni_master_port']}")

    real = startup.launch_headless_diffusion_replicas
    startup.launch_headless_diffusion_replicas = record
    try:
        run_headless(args)
    finally:
        startup.launch_headless_diffusion_replicas = real
    return {"headless_launch": seen}


def _batch_keys() -> dict:
    """Which /v1/videos-shaped requests the request scheduler lets share one forward."""
    from vllm.lora.request import LoRARequest
    from PIL import Image
    from vllm_omni.diffusion.data import OmniDiffusionConfig
    from vllm_omni.diffusion.models.wan2_2.pipeline_wan2_2 import get_wan22_pre_process_func
    from vllm_omni.diffusion.request import OmniDiffusionRequest
    from vllm_omni.diffusion.sched.request_scheduler import build_request_batch_sampling_params_key
    from vllm_omni.inputs.data import OmniDiffusionSamplingParams

    pre = get_wan22_pre_process_func(OmniDiffusionConfig(model=TI2V, model_class_name="Wan22Pipeline"))
    base = dict(height=704, width=1280, num_frames=121, num_inference_steps=50, guidance_scale=5.0, fps=24, seed=1)

    def key(prompt="a cat", image=None, lora=None, flow_shift=None, **change):
        sp = OmniDiffusionSamplingParams(**{**base, **change})
        if flow_shift is not None:
            sp.extra_args = {"flow_shift": flow_shift}
        if lora is not None:
            sp.lora_request = LoRARequest(f"lora{lora}", lora, f"/loras/{lora}")
        p = {"prompt": prompt} if image is None else {"prompt": prompt, "multi_modal_data": {"image": image}}
        return build_request_batch_sampling_params_key(pre(OmniDiffusionRequest(p, sp, f"r-{id(sp)}")))

    ref = key()
    variants = {
        "other_prompt": key(prompt="a dog"), "other_seed": key(seed=2), "other_frames": key(num_frames=81),
        "other_size": key(height=480, width=832), "other_steps": key(num_inference_steps=40),
        "other_guidance": key(guidance_scale=4.0), "other_fps": key(fps=16), "other_flow_shift": key(flow_shift=3.0),
        "with_image": key(image=Image.new("RGB", (64, 64))), "lora_1": key(lora=1), "lora_2": key(lora=2),
    }
    out = {name: k == ref for name, k in variants.items()}
    out["lora_1_vs_lora_1"] = key(lora=1, prompt="x") == key(lora=1, prompt="y", seed=9)
    return out


def _run_case(main, omni_serve, case: dict) -> dict:
    import contextlib
    import io

    captured: dict = {}

    def record_args(args) -> None:
        captured["args"] = {k: _plain(getattr(args, k, "<absent>")) for k in ARG_KEYS}

    async def server(args, **_uvicorn_kwargs) -> None:   # stands in for omni_run_server
        record_args(args)
        captured.update(_resolve_runtime(args))

    def headless(args) -> None:                            # wraps the real run_headless
        record_args(args)
        captured.update(_run_headless(args))

    saved_argv, saved_env = sys.argv, dict(os.environ)
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    os.environ["VLLM_OMNI_STUB_DEVICE_COUNT"] = str(case.get("visible_devices", 1))
    err = io.StringIO()
    omni_serve.omni_run_server, omni_serve.run_headless = server, headless
    try:
        sys.argv = ["vllm", *case["argv"]]
        with contextlib.redirect_stderr(err):
            main()
        return {"ok": True, **captured}
    except SystemExit as exc:
        lines = err.getvalue().strip().splitlines()
        return {"ok": False, "stage": "parse", "exit_code": exc.code, "error": lines[-1] if lines else ""}
    except Exception as exc:  # noqa: BLE001 - report what upstream raised, by type and text
        return {"ok": False, "stage": "validate" if "args" not in captured else "resolve",
                "error_type": type(exc).__name__, "error": str(exc), **captured}
    finally:
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)


def probe(cases: dict) -> dict:
    """Server side: every case of ``cases`` (name -> ``{"argv", "visible_devices"}``) and the
    batch keys.  Called by ``upstream_resolve.py`` (``{"call": "replica_probe:probe"}``),
    which has installed the fixture Hub and the device inventory; the entry points this
    replaces per case are put back afterwards, so the resolver's own cases are unaffected."""
    import vllm_omni.entrypoints.cli.serve as omni_serve
    from vllm_omni.entrypoints.cli.main import main

    saved = omni_serve.omni_run_server, omni_serve.run_headless
    REAL["run_headless"] = omni_serve.run_headless
    try:
        answer = {name: _run_case(main, omni_serve, case) for name, case in cases.items()}
        answer["batch_keys"] = _batch_keys()
    finally:
        omni_serve.omni_run_server, omni_serve.run_headless = saved
    return answer
