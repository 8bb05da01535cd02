"""vLLM-Omni 0.30's own replica, head/headless and request-batching knobs for a Wan2.2 model,
checked against the REAL 0.30 parser and config resolution (server environment, no GPU).

docs/replicas.md relies on every fact asserted here.  One server-python process (this file run
as ``python test_replica_flags.py --probe``) answers all cases, so vLLM is imported once:

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

The fake Hub and device inventory are the seams of ``upstream.py`` (configs only, N GPUs).
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
I2V = "Wan-AI/Wan2.2-I2V-A14B-Diffusers"
HEAD = ["--stage-id", "0", "--omni-master-address", "127.0.0.1", "--omni-master-port", "29555"]

# A deploy YAML asking for two replicas of stage 0 on logical GPUs 0 and 1.
TWO_REPLICAS_YAML = 'async_chunk: false\nstages:\n  - stage_id: 0\n    devices: "0,1"\n    num_replicas: 2\n'
# I2V-A14B has no pipeline registry entry, so its YAML is ignored unless it names one and the class.
I2V_REPLICAS_YAML = ('async_chunk: false\npipeline: wan2_2_ti2v\nstages:\n  - stage_id: 0\n    devices: "0,1"\n'
                     '    num_replicas: 2\n    model_class_name: WanImageToVideoPipeline\n')
# The same GPUs without a replica count (what a head or headless runtime splits itself).
TWO_DEVICES_YAML = 'async_chunk: false\nstages:\n  - stage_id: 0\n    devices: "0,1"\n'


# ------------------------------------------------------------------ server side (server python)
REAL: dict = {}   # upstream functions the probe wraps (filled in _probe_main)
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


def _probe_main() -> int:
    sys.path.insert(0, HERE)
    import upstream

    upstream.server_python_ok()
    cases = json.loads(sys.stdin.read())
    out = os.fdopen(os.dup(1), "w")
    sink = os.open(os.devnull, os.O_WRONLY)
    os.dup2(sink, 1)   # upstream logs must not corrupt the JSON answer
    os.dup2(sink, 2)
    upstream.prepare_process_env()
    upstream.install_fixture_hub()
    upstream.install_device_inventory()
    import vllm_omni.entrypoints.cli.serve as omni_serve
    from vllm_omni.entrypoints.cli.main import main

    REAL["run_headless"] = omni_serve.run_headless
    answer = {name: _run_case(main, omni_serve, case) for name, case in cases.items()}
    answer["batch_keys"] = _batch_keys()
    json.dump(answer, out)
    out.write("\n")
    out.flush()
    upstream.remove_temp_dirs()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(_probe_main())


# ------------------------------------------------------------------ test side (ComfyUI python)
def _serve(model: str, *flags: str) -> list[str]:
    return ["serve", model, "--omni", *flags]


@functools.lru_cache(maxsize=1)
def _results() -> dict:
    import stubserver

    with tempfile.TemporaryDirectory() as tmp:
        two_replicas = os.path.join(tmp, "two_replicas.yaml")
        two_devices = os.path.join(tmp, "two_devices.yaml")
        i2v_replicas = os.path.join(tmp, "i2v_replicas.yaml")
        for path, text in ((two_replicas, TWO_REPLICAS_YAML), (two_devices, TWO_DEVICES_YAML),
                           (i2v_replicas, I2V_REPLICAS_YAML)):
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        two = {"visible_devices": 2}
        cases = {
            "defaults": {"argv": _serve(TI2V)},
            "yaml_replicas": {"argv": _serve(TI2V, "--deploy-config", two_replicas), **two},
            "overrides_replicas": {"argv": _serve(TI2V, "--stage-overrides", '{"0": {"num_replicas": 2, "devices": "0,1"}}'), **two},
            "i2v_yaml_replicas": {"argv": _serve(I2V, "--deploy-config", two_replicas), **two},
            "i2v_overrides_replicas": {"argv": _serve(I2V, "--stage-overrides", '{"0": {"num_replicas": 2, "devices": "0,1"}}'), **two},
            "i2v_pipeline_yaml_replicas": {"argv": _serve(I2V, "--deploy-config", i2v_replicas), **two},
            "head": {"argv": _serve(TI2V, *HEAD, "--deploy-config", two_devices, "--omni-dp-size-local", "2",
                                    "--omni-lb-policy", "least-queue-length", "--omni-heartbeat-timeout", "60"), **two},
            "head_yaml_replicas": {"argv": _serve(TI2V, *HEAD, "--deploy-config", two_replicas), **two},
            "headless": {"argv": _serve(TI2V, "--headless", *HEAD, "--deploy-config", two_devices,
                                        "--omni-dp-size-local", "2", "--omni-replica-address", "127.0.0.1"), **two},
            "headless_overrides": {"argv": _serve(TI2V, "--headless", *HEAD, "--omni-dp-size-local", "2",
                                                  "--stage-overrides", '{"0": {"devices": "0,1"}}'), **two},
            "headless_no_devices": {"argv": _serve(TI2V, "--headless", *HEAD, "--omni-dp-size-local", "2"), **two},
            "headless_ray": {"argv": _serve(TI2V, "--headless", *HEAD, "--worker-backend", "ray")},
            "head_ray": {"argv": _serve(TI2V, "--worker-backend", "ray", "--ray-address", "127.0.0.1:6379")},
            "batching": {"argv": _serve(TI2V, "--max-num-seqs", "4", "--request-batch-max-wait-ms", "50")},
            "i2v_batching": {"argv": _serve(I2V, "--max-num-seqs", "2")},
            "bundled_yaml": {"argv": _serve(TI2V, "--deploy-config", "wan2_2_ti2v.yaml")},
            "stage_id_alone": {"argv": _serve(TI2V, "--stage-id", "0")},
            "replica_address_on_head": {"argv": _serve(TI2V, *HEAD, "--omni-replica-address", "127.0.0.1")},
            "dp_local_without_stage": {"argv": _serve(TI2V, "--omni-dp-size-local", "2")},
            "bad_lb_policy": {"argv": _serve(TI2V, *HEAD, "--omni-lb-policy", "fastest")},
            "zero_heartbeat": {"argv": _serve(TI2V, *HEAD, "--omni-heartbeat-timeout", "0")},
            "api_servers": {"argv": _serve(TI2V, "--api-server-count", "2")},
            "blog_batch_flag": {"argv": _serve(TI2V, "--max-num-batched-requests", "4")},
        }
        proc = subprocess.run([stubserver.server_python(), os.path.abspath(__file__), "--probe"],
                              input=json.dumps(cases), capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0 and proc.stdout.strip(), f"probe failed ({proc.returncode}): {proc.stderr[-3000:]}"
    return json.loads(proc.stdout)


def _ok(name: str) -> dict:
    result = _results()[name]
    assert result["ok"], result
    return result


def _refused(name: str) -> dict:
    result = _results()[name]
    assert not result["ok"], result
    return result


def test_replica_flags_exist_with_upstream_defaults():
    args = _ok("defaults")["args"]
    assert args == {"stage_id": None, "omni_master_address": None, "omni_master_port": None,
                    "omni_replica_address": None, "omni_dp_size_local": 1, "omni_lb_policy": "random",
                    "omni_heartbeat_timeout": 30.0, "headless": False, "worker_backend": "multi_process",
                    "ray_address": None, "max_num_seqs": None, "request_batch_max_wait_ms": 0.0, "replica_id": None}


def test_plain_server_is_one_replica_and_batches_nothing():
    r = _ok("defaults")
    assert (r["runtime"], r["replicas"], r["max_num_seqs"], r["request_batch_max_wait_ms"]) == ("StageRuntime", 1, 1, 0.0)


def test_num_replicas_in_a_deploy_yaml_gives_one_replica_per_gpu_on_one_runtime():
    r = _ok("yaml_replicas")
    assert (r["runtime"], r["launch_mode"], r["replicas"], r["replica_devices"]) == ("StageRuntime", "local", 2, ["0", "1"])


def test_stage_overrides_set_replicas_without_a_yaml():
    r = _ok("overrides_replicas")
    assert (r["replicas"], r["replica_devices"]) == (2, ["0", "1"])


def test_i2v_a14b_gets_replicas_only_from_a_yaml_that_names_pipeline_and_class():
    assert _ok("i2v_yaml_replicas")["replicas"] == 1
    assert _ok("i2v_overrides_replicas")["replicas"] == 1
    r = _ok("i2v_pipeline_yaml_replicas")
    assert (r["model_class_name"], r["replicas"], r["replica_devices"]) == ("WanImageToVideoPipeline", 2, ["0", "1"])


def test_head_runs_its_stage_locally_with_omni_dp_size_local_replicas():
    r = _ok("head")
    assert (r["runtime"], r["launch_mode"], r["replicas"], r["replica_devices"]) == \
        ("DistStageRuntime", "local", 2, ["0", "1"])
    assert (r["args"]["omni_lb_policy"], r["args"]["omni_heartbeat_timeout"]) == ("least-queue-length", 60.0)


def test_head_overrides_num_replicas_of_the_yaml_with_omni_dp_size_local():
    r = _ok("head_yaml_replicas")
    assert (r["runtime"], r["replicas"]) == ("DistStageRuntime", 1)


def test_headless_launches_omni_dp_size_local_replicas_on_split_devices():
    launch = _ok("headless")["headless_launch"]
    assert launch == {"omni_dp_size_local": 2, "per_replica_devices": ["0", "1"],
                      "replica_bind_address": "127.0.0.1", "master": "127.0.0.1:29555"}
    assert _ok("headless_overrides")["headless_launch"]["per_replica_devices"] == ["0", "1"]


def test_headless_without_devices_gives_no_replica_its_own_gpu():
    assert _ok("headless_no_devices")["headless_launch"]["per_replica_devices"] == [None, None]


def test_ray_worker_backend_is_refused_headless_and_unused_on_the_head():
    r = _refused("headless_ray")
    assert r["error"] == "headless mode requires worker_backend=multi_process"
    head = _ok("head_ray")
    assert (head["args"]["worker_backend"], head["replicas"], head["runtime"]) == ("ray", 1, "StageRuntime")


def test_request_batching_flags_reach_the_diffusion_config_of_a_batching_wan_pipeline():
    r = _ok("batching")
    assert (r["max_num_seqs"], r["request_batch_max_wait_ms"], r["supports_request_batch"]) == (4, 50.0, True)
    i2v = _ok("i2v_batching")
    assert (i2v["model_class_name"], i2v["max_num_seqs"], i2v["supports_request_batch"]) == \
        ("WanImageToVideoPipeline", 2, True)


def test_bundled_ti2v_yaml_turns_on_a_batch_width_of_four():
    assert _ok("bundled_yaml")["max_num_seqs"] == 4


def test_only_prompt_and_seed_may_differ_within_one_batch():
    keys = _results()["batch_keys"]
    assert keys == {"other_prompt": True, "other_seed": True, "other_frames": False, "other_size": False,
                    "other_steps": False, "other_guidance": False, "other_fps": False, "other_flow_shift": False,
                    "with_image": False, "lora_1": False, "lora_2": False, "lora_1_vs_lora_1": True}


def test_upstream_refuses_inconsistent_replica_flags():
    expected = {
        "stage_id_alone": "--stage-id requires both --omni-master-address and --omni-master-port to be set",
        "replica_address_on_head": "--omni-replica-address requires --headless to be set",
        "dp_local_without_stage": "--omni-dp-size-local != 1 requires --stage-id to be set",
        "zero_heartbeat": "--omni-heartbeat-timeout must be > 0, got 0.0",
        "api_servers": "--api-server-count > 1 is not supported for diffusion models",
    }
    for name, message in expected.items():
        r = _refused(name)
        assert (r["stage"], r["error"]) == ("validate", message), (name, r)


def test_argparse_refuses_unknown_policy_and_the_blog_batch_flag():
    bad = _refused("bad_lb_policy")
    assert bad["exit_code"] == 2 and "invalid choice: 'fastest'" in bad["error"]
    blog = _refused("blog_batch_flag")
    assert blog["exit_code"] == 2 and "unrecognized arguments: --max-num-batched-requests" in blog["error"]
