"""Several machines (issue 17): the head and join roles' argv, their local-config settings, and the two
watch policies (a wedged head, a joined replica's head gone), without servers.

The same argv runs against the real vLLM-Omni 0.30 in tests/contract/test_join_head.py."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from vllm_omni_launcher.cli import main
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.server.process.launch_prep import Launch
from vllm_omni_launcher.server.config.local_config import LocalConfig, load_local_config
from vllm_omni_launcher.server.logs.log_follower import LogFollower
from vllm_omni_launcher.server.supervision.multi_host import (HeadlessRun, HeadRole, JoinRole, LB_POLICY, Registrations, ServerRole,
                                                   parse_head_address, probe_tcp)
from vllm_omni_launcher.server.launch.spec import LaunchSpec, ParallelConfig
from vllm_omni_launcher.server.supervision.wedge_watch import REACHABLE, REFUSED, UNREACHABLE, HeadLossPolicy, StallPolicy

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"


def _launch(spec: LaunchSpec, key: str = "secret-key") -> Launch:
    command = spec.build(["vllm"], 8091, key)
    return Launch(spec, command, 8091, Path("/nonexistent"), api_key=key, env={**command.env, "PYTHONUNBUFFERED": "1"})


def _after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


# ---- argv ------------------------------------------------------------------------------------------------
def test_head_argv_adds_the_stage_0_head_flags_and_asks_its_replicas_by_omni_dp_size_local():
    spec = LaunchSpec(TI2V, gpus=(0, 1), replicas=2)
    launch = HeadRole("10.0.0.5", 29555, 900.0).adapt(_launch(spec))
    argv = launch.command.argv
    assert argv[:4] == ["vllm", "serve", TI2V, "--omni"]
    assert (_after(argv, "--stage-id"), _after(argv, "--omni-master-address"), _after(argv, "--omni-master-port"),
            _after(argv, "--omni-lb-policy")) == ("0", "10.0.0.5", "29555", LB_POLICY)
    assert _after(argv, "--omni-dp-size-local") == "2"
    assert json.loads(_after(argv, "--stage-overrides")) == {"0": {"devices": "0,1"}}   # no num_replicas on a head
    assert (_after(argv, "--host"), _after(argv, "--port")) == ("127.0.0.1", "8091")
    assert launch.command.env["CUDA_VISIBLE_DEVICES"] == "0,1" and launch.api_key == "secret-key"
    assert "secret-key" not in " ".join(argv)


def test_head_argv_of_one_replica_has_no_stage_override():
    argv = HeadRole("127.0.0.1", 29555, 900.0).adapt(_launch(LaunchSpec(TI2V, gpus=(0,)))).command.argv
    assert "--stage-overrides" not in argv and "--omni-dp-size-local" not in argv and "--stage-id" in argv


def test_join_argv_is_a_headless_runtime_without_host_port_or_key():
    spec = LaunchSpec(T2V := "Wan-AI/Wan2.2-T2V-A14B-Diffusers", gpus=(0, 1, 2, 3), replicas=2,
                      parallel=ParallelConfig("ulysses", 2))
    role = JoinRole("10.0.0.5", 29555, "10.0.0.6", 120.0)
    argv = role.adapt(_launch(spec, key="")).command.argv
    assert argv[:4] == ["vllm", "serve", T2V, "--omni"]
    assert "--headless" in argv and "--host" not in argv and "--port" not in argv
    assert (_after(argv, "--stage-id"), _after(argv, "--omni-master-address"), _after(argv, "--omni-master-port"),
            _after(argv, "--omni-replica-address")) == ("0", "10.0.0.5", "29555", "10.0.0.6")
    assert _after(argv, "--usp") == "2" and _after(argv, "--omni-dp-size-local") == "2"
    assert json.loads(_after(argv, "--stage-overrides")) == {"0": {"devices": "0,1,2,3"}}
    assert "--omni-lb-policy" not in argv                    # head only


def test_join_without_a_replica_address_leaves_it_to_upstream():
    argv = JoinRole("127.0.0.1", 29555, None, 120.0).adapt(_launch(LaunchSpec(TI2V, gpus=(0,)), key="")).command.argv
    assert "--omni-replica-address" not in argv and argv[-2:] == ["--omni-master-port", "29555"]


def test_the_plain_role_changes_nothing():
    launch = _launch(LaunchSpec(TI2V, gpus=(0, 1), replicas=2))
    assert ServerRole().adapt(launch) is launch


@pytest.mark.parametrize("text, expected", [("10.0.0.5:29555", ("10.0.0.5", 29555)),
                                            ("[fd00::5]:29555", ("fd00::5", 29555))])
def test_join_address_is_addr_colon_port(text, expected):
    assert parse_head_address(text) == expected


@pytest.mark.parametrize("text", ["10.0.0.5", ":29555", "10.0.0.5:0", "10.0.0.5:port", "10.0.0.5:70000"])
def test_a_join_address_without_a_port_is_refused_naming_the_option(text):
    with pytest.raises(LauncherError) as err:
        parse_head_address(text)
    assert err.value.setting == "--join" and "ADDR:PORT" in err.value.what


# ---- the local config: binding and trust ------------------------------------------------------------------
def test_registration_binds_loopback_unless_the_local_config_says_otherwise(tmp_path):
    default = HeadRole.from_config(29555, LocalConfig())
    assert default.host == "127.0.0.1" and "only from this machine" in default.warnings()[0]
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"replica_registration_host": "10.0.0.5", "head_stall_timeout_s": 600}))
    config = load_local_config({"VLLM_OMNI_LAUNCHER_CONFIG": str(cfg)})
    open_head = HeadRole.from_config(29555, config)
    assert (open_head.host, open_head.stall_timeout_s) == ("10.0.0.5", 600.0)
    assert "NO authentication" in open_head.warnings()[0]
    env = load_local_config({"VLLM_OMNI_LAUNCHER_CONFIG": str(tmp_path / "none.json"),
                             "VLLM_OMNI_LAUNCHER_REPLICA_ADDRESS": "10.0.0.6"})
    assert JoinRole.from_config("10.0.0.5:29555", env).replica_address == "10.0.0.6"


def test_a_bad_stall_timeout_is_refused_naming_the_key(tmp_path):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"head_stall_timeout_s": 0}))
    with pytest.raises(LauncherError) as err:
        load_local_config({"VLLM_OMNI_LAUNCHER_CONFIG": str(cfg)})
    assert err.value.setting == "head_stall_timeout_s"


def test_head_port_out_of_range_is_refused():
    with pytest.raises(LauncherError) as err:
        HeadRole.from_config(70000, LocalConfig())
    assert err.value.setting == "--accept-replicas"


def test_serve_join_refuses_key_options_and_a_second_role(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(tmp_path / "none.json"))
    assert main(["serve", "--model", TI2V, "--join", "127.0.0.1:1", "--no-api-key"]) == 1
    assert "--join takes no API key option" in capsys.readouterr().err
    assert main(["serve", "--model", TI2V, "--join", "127.0.0.1:1", "--accept-replicas", "29555"]) == 2


def test_serve_join_refuses_to_start_without_a_head(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(tmp_path / "none.json"))
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]          # bound, never listening: connections are refused
        assert main(["serve", "--model", TI2V, "--join", f"127.0.0.1:{port}"]) == 1
    err = capsys.readouterr().err
    assert f"The head at 127.0.0.1:{port} is not reachable (refused)" in err and "--accept-replicas" in err


def test_a_role_flag_is_not_an_extra_flag():
    for flag in ("--headless", "--stage-id=0", "--omni-master-port=1"):
        with pytest.raises(LauncherError) as err:
            LaunchSpec(TI2V, extra_flags=(flag,)).validate()
        assert err.value.setting == "extra_flags"


# ---- readiness and the head probe -------------------------------------------------------------------------
def test_a_headless_run_is_ready_once_each_replica_registered(tmp_path):
    log = tmp_path / "server.log"
    run = HeadlessRun.__new__(HeadlessRun)
    run.log_path, run.expected, run.registrations = str(log), 2, Registrations(lambda text, ends: None)
    follower = LogFollower(str(log), run.registrations.segment)       # what ServerRun.spawn starts
    line = "(APIServer pid=7) INFO 12:00:00 StageDiffusionProc registered with OmniCoordinator " \
           "(stage_id=0 replica_id={} coord=tcp://127.0.0.1:5555)\n"
    log.write_text("[Headless] Diffusion replica id=1 for stage 0 is up\n" + line.format(1) + line.format(1))
    follower.poll_once()
    assert run.registered() == 1 and not run.answers()
    log.write_text(log.read_text() + line.format(2))
    follower.poll_once()
    assert run.registered() == 2 and run.answers()


def test_probe_tells_a_refused_port_from_a_listening_one():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert probe_tcp("127.0.0.1", port) == REACHABLE
    assert probe_tcp("127.0.0.1", port) == REFUSED


def test_probe_counts_a_head_that_never_answers_as_unreachable(monkeypatch):
    """A firewall that drops the packets (or a host that is down) gives no refusal, only a timeout:
    that is UNREACHABLE, which the head-loss policy counts only after hang_timeout_s."""
    def silent(address, timeout=None):
        raise socket.timeout("timed out")
    monkeypatch.setattr(socket, "create_connection", silent)
    assert probe_tcp("127.0.0.1", 9, timeout=0.01) == UNREACHABLE


# ---- the policies ----------------------------------------------------------------------------------------
def test_waiting_jobs_with_nothing_moving_for_the_timeout_mean_a_wedged_head():
    policy = StallPolicy(timeout_s=60)
    assert policy.observe(0, {"a": "in_progress", "b": "queued"}, activity=0) is None
    assert policy.observe(30, {"a": "in_progress", "b": "queued", "c": "queued"}, activity=0) is None  # arrivals
    assert policy.observe(59, {"a": "in_progress", "b": "queued", "c": "queued"}, activity=0) is None
    assert policy.observe(61, {"a": "in_progress", "b": "queued", "c": "queued"}, activity=0) == 61
    assert policy.waiting == 3


def test_a_status_change_a_vanished_job_or_a_denoise_step_is_progress():
    policy = StallPolicy(timeout_s=60)
    policy.observe(0, {"a": "in_progress", "b": "queued"}, activity=0)
    assert policy.observe(50, {"a": "completed", "b": "in_progress"}, activity=0) is None     # a finished
    assert policy.observe(100, {"b": "in_progress"}, activity=0) is None
    assert policy.observe(109, {"b": "in_progress"}, activity=0) is None
    assert policy.observe(111, {"b": "in_progress"}, activity=0) == 61
    policy.observe(112, {"b": "in_progress"}, activity=112.0)                                 # the head's denoise
    assert policy.observe(171, {"b": "in_progress"}, activity=112.0) is None
    assert policy.observe(200, {}, activity=112.0) is None                                     # nothing waits
    assert policy.observe(300, {"d": "queued"}, activity=112.0) is None                        # starts over
    assert policy.observe(359, {"d": "queued"}, activity=112.0) is None


def test_a_refused_head_port_is_a_lost_head_at_once_and_silence_after_the_grace():
    policy = HeadLossPolicy(unreachable_s=120)
    assert policy.observe(0, REACHABLE) is None
    assert policy.observe(1, REFUSED) == REFUSED
    assert policy.observe(2, UNREACHABLE) is None
    assert policy.observe(100, REACHABLE) is None                  # the network came back
    assert policy.observe(101, UNREACHABLE) is None
    assert policy.observe(220, UNREACHABLE) is None
    assert policy.observe(221, UNREACHABLE) == UNREACHABLE


def test_a_replica_without_its_head_is_explained_naming_join():
    from vllm_omni_launcher.server.logs import failures

    ctx = failures.Context(model=TI2V, ever_ready=False, exit_code=-1)
    ours = ["vllm-omni-launcher: the head's registration port 127.0.0.1:29555 refuses connections while this "
            "replica started; stopping it so that it registers again"]
    upstream = ["RuntimeError: Timed out waiting for registration response from OmniMasterServer "
                "(10.0.0.5:29555) for stage 0."]
    for tail, where in ((ours, "127.0.0.1:29555"), (upstream, "10.0.0.5:29555")):
        err = failures.classify(tail, ctx)
        assert (err.kind, err.setting) == (failures.CRASH, "--join") and where in err.what
        assert failures.CRASH not in failures.PERMANENT       # so the restart budget retries it


def test_a_ready_replica_whose_head_port_refuses_is_restarted_with_a_message_naming_join():
    """After ready, the join role's watch probes the head: a refusal is the head gone, a crash
    of this replica (so the supervisor restarts it), explained in words naming --join."""
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        port = spare.getsockname()[1]               # closed again below: nothing listens there

    class Run:
        def tail(self, lines: int = 40) -> list[str]:
            return ["INFO StageDiffusionProc registered with OmniCoordinator (stage_id=0 replica_id=1 coord=x)"]

    from vllm_omni_launcher.server.logs import failures

    watch = JoinRole("127.0.0.1", port, None, 120.0).watch(Run(), progress=None)
    failure = watch()
    assert failure is not None and (failure.kind, failure.setting) == (failures.CRASH, "--join")
    assert failure.what == f"The head's registration port 127.0.0.1:{port} refuses connections"
    assert "restarts this replica" in failure.fix and "registered with OmniCoordinator" in failure.raw
