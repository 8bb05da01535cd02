"""The GPU bench's one server run (bench/gpu/common.py `ServerRun`, used by `levers`, `calibrate` and
bench/gpu_a14b.py): a server that fails to start is a result in the phase's report, never a crash, and the run
still stops it, copies its log and saves the report, so the phase goes on with its next server."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
try:
    from bench.gpu import common
finally:
    sys.path.remove(str(REPO))      # the repo root holds top-level names (server, nodes) ComfyUI also uses

from vllm_omni_launcher.server.config.local_config import LocalConfig  # noqa: E402
from vllm_omni_launcher.server.launch.spec import LaunchSpec  # noqa: E402


def _failing(tmp_path):
    spec = LaunchSpec("Wan-AI/Wan2.2-TI2V-5B-Diffusers", gpus=(0,))
    spec.validate()
    config = LocalConfig(server_command=("/bin/sh", "-c", "echo boom-from-the-server >&2; exit 3", "--"),
                         data_dir=str(tmp_path / "data"), gpu_lock_dir=str(tmp_path / "locks"))
    return spec, config


def test_a_failed_start_is_recorded_with_the_servers_words_and_the_server_is_still_stopped(tmp_path):
    spec, config = _failing(tmp_path)
    entry: dict = {"config": "eager", "jobs": []}
    saved, after_stop, body_ran_past_start = [], [], []
    with common.ServerRun(entry, spec, config, logs=str(tmp_path / "logs"), log_name="eager",
                          save=lambda: saved.append(dict(entry)), after_stop=lambda: after_stop.append(True)) as run:
        run.start()
        body_ran_past_start.append(True)
    assert body_ran_past_start == []
    assert entry["error"].startswith("ServerFailure: ") and "exit code 3" in entry["error"]
    assert "boom-from-the-server" in entry["log_tail"]
    assert "ready_s" not in entry and isinstance(entry["stop_s"], float)
    assert "gpu_processes_after_stop" in entry and after_stop == [True]
    assert "boom-from-the-server" in (tmp_path / "logs" / "eager.log").read_text()
    assert saved and saved[-1]["stop_s"] == entry["stop_s"]         # saved after the stop, with its fields
    assert not run.sup.alive()


def test_an_interrupt_is_not_swallowed_but_the_run_still_stops_and_saves(tmp_path):
    spec, config = _failing(tmp_path)
    entry: dict = {"jobs": []}
    saved = []
    with pytest.raises(KeyboardInterrupt):      # SIGINT (bench/gpu_session.sh's limit) ends the phase
        with common.ServerRun(entry, spec, config, save=lambda: saved.append(True)):
            raise KeyboardInterrupt
    assert "error" not in entry and "stop_s" in entry and saved == [True]
