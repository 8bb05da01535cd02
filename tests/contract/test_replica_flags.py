"""vLLM-Omni 0.30's own replica, head/headless and request-batching knobs for a Wan2.2 model,
checked against the REAL 0.30 parser and config resolution (server environment, no GPU).

docs/replicas.md relies on every fact asserted here.  All cases are answered at once by
``replica_probe.probe`` (what it runs of upstream and what it replaces: see there), inside the
session's resolver process (``upstream_resolver``), so this module imports vLLM no second time.
"""
from __future__ import annotations

import os
import tempfile

import pytest

from replica_probe import I2V, TI2V

HEAD = ["--stage-id", "0", "--omni-master-address", "127.0.0.1", "--omni-master-port", "29555"]

# A deploy YAML asking for two replicas of stage 0 on logical GPUs 0 and 1.
TWO_REPLICAS_YAML = 'async_chunk: false\nstages:\n  - stage_id: 0\n    devices: "0,1"\n    num_replicas: 2\n'
# I2V-A14B has no pipeline registry entry, so its YAML is ignored unless it names one and the class.
I2V_REPLICAS_YAML = ('async_chunk: false\npipeline: wan2_2_ti2v\nstages:\n  - stage_id: 0\n    devices: "0,1"\n'
                     '    num_replicas: 2\n    model_class_name: WanImageToVideoPipeline\n')
# The same GPUs without a replica count (what a head or headless runtime splits itself).
TWO_DEVICES_YAML = 'async_chunk: false\nstages:\n  - stage_id: 0\n    devices: "0,1"\n'


def _serve(model: str, *flags: str) -> list[str]:
    return ["serve", model, "--omni", *flags]


@pytest.fixture(scope="module")
def results(upstream_resolver) -> dict:
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
        [answer] = upstream_resolver.resolve([{"call": "replica_probe:probe", "input": cases}], timeout=1500)
    assert "call_error" not in answer, answer.get("call_error")
    return answer


def _ok(results: dict, name: str) -> dict:
    result = results[name]
    assert result["ok"], result
    return result


def _refused(results: dict, name: str) -> dict:
    result = results[name]
    assert not result["ok"], result
    return result


def test_replica_flags_exist_with_upstream_defaults(results):
    args = _ok(results, "defaults")["args"]
    assert args == {"stage_id": None, "omni_master_address": None, "omni_master_port": None,
                    "omni_replica_address": None, "omni_dp_size_local": 1, "omni_lb_policy": "random",
                    "omni_heartbeat_timeout": 30.0, "headless": False, "worker_backend": "multi_process",
                    "ray_address": None, "max_num_seqs": None, "request_batch_max_wait_ms": 0.0, "replica_id": None}


def test_plain_server_is_one_replica_and_batches_nothing(results):
    r = _ok(results, "defaults")
    assert (r["runtime"], r["replicas"], r["max_num_seqs"], r["request_batch_max_wait_ms"]) == ("StageRuntime", 1, 1, 0.0)


def test_num_replicas_in_a_deploy_yaml_gives_one_replica_per_gpu_on_one_runtime(results):
    r = _ok(results, "yaml_replicas")
    assert (r["runtime"], r["launch_mode"], r["replicas"], r["replica_devices"]) == ("StageRuntime", "local", 2, ["0", "1"])


def test_stage_overrides_set_replicas_without_a_yaml(results):
    r = _ok(results, "overrides_replicas")
    assert (r["replicas"], r["replica_devices"]) == (2, ["0", "1"])


def test_i2v_a14b_gets_replicas_only_from_a_yaml_that_names_pipeline_and_class(results):
    assert _ok(results, "i2v_yaml_replicas")["replicas"] == 1
    assert _ok(results, "i2v_overrides_replicas")["replicas"] == 1
    r = _ok(results, "i2v_pipeline_yaml_replicas")
    assert (r["model_class_name"], r["replicas"], r["replica_devices"]) == ("WanImageToVideoPipeline", 2, ["0", "1"])


def test_head_runs_its_stage_locally_with_omni_dp_size_local_replicas(results):
    r = _ok(results, "head")
    assert (r["runtime"], r["launch_mode"], r["replicas"], r["replica_devices"]) == \
        ("DistStageRuntime", "local", 2, ["0", "1"])
    assert (r["args"]["omni_lb_policy"], r["args"]["omni_heartbeat_timeout"]) == ("least-queue-length", 60.0)


def test_head_overrides_num_replicas_of_the_yaml_with_omni_dp_size_local(results):
    r = _ok(results, "head_yaml_replicas")
    assert (r["runtime"], r["replicas"]) == ("DistStageRuntime", 1)


def test_headless_launches_omni_dp_size_local_replicas_on_split_devices(results):
    launch = _ok(results, "headless")["headless_launch"]
    assert launch == {"omni_dp_size_local": 2, "per_replica_devices": ["0", "1"],
                      "replica_bind_address": "127.0.0.1", "master": "127.0.0.1:29555"}
    assert _ok(results, "headless_overrides")["headless_launch"]["per_replica_devices"] == ["0", "1"]


def test_headless_without_devices_gives_no_replica_its_own_gpu(results):
    assert _ok(results, "headless_no_devices")["headless_launch"]["per_replica_devices"] == [None, None]


def test_ray_worker_backend_is_refused_headless_and_unused_on_the_head(results):
    r = _refused(results, "headless_ray")
    assert r["error"] == "headless mode requires worker_backend=multi_process"
    head = _ok(results, "head_ray")
    assert (head["args"]["worker_backend"], head["replicas"], head["runtime"]) == ("ray", 1, "StageRuntime")


def test_request_batching_flags_reach_the_diffusion_config_of_a_batching_wan_pipeline(results):
    r = _ok(results, "batching")
    assert (r["max_num_seqs"], r["request_batch_max_wait_ms"], r["supports_request_batch"]) == (4, 50.0, True)
    i2v = _ok(results, "i2v_batching")
    assert (i2v["model_class_name"], i2v["max_num_seqs"], i2v["supports_request_batch"]) == \
        ("WanImageToVideoPipeline", 2, True)


def test_bundled_ti2v_yaml_turns_on_a_batch_width_of_four(results):
    assert _ok(results, "bundled_yaml")["max_num_seqs"] == 4


def test_only_prompt_and_seed_may_differ_within_one_batch(results):
    keys = results["batch_keys"]
    assert keys == {"other_prompt": True, "other_seed": True, "other_frames": False, "other_size": False,
                    "other_steps": False, "other_guidance": False, "other_fps": False, "other_flow_shift": False,
                    "with_image": False, "lora_1": False, "lora_2": False, "lora_1_vs_lora_1": True}


def test_upstream_refuses_inconsistent_replica_flags(results):
    expected = {
        "stage_id_alone": "--stage-id requires both --omni-master-address and --omni-master-port to be set",
        "replica_address_on_head": "--omni-replica-address requires --headless to be set",
        "dp_local_without_stage": "--omni-dp-size-local != 1 requires --stage-id to be set",
        "zero_heartbeat": "--omni-heartbeat-timeout must be > 0, got 0.0",
        "api_servers": "--api-server-count > 1 is not supported for diffusion models",
    }
    for name, message in expected.items():
        r = _refused(results, name)
        assert (r["stage"], r["error"]) == ("validate", message), (name, r)


def test_argparse_refuses_unknown_policy_and_the_blog_batch_flag(results):
    bad = _refused(results, "bad_lb_policy")
    assert bad["exit_code"] == 2 and "invalid choice: 'fastest'" in bad["error"]
    blog = _refused(results, "blog_batch_flag")
    assert blog["exit_code"] == 2 and "unrecognized arguments: --max-num-batched-requests" in blog["error"]
