"""`python -m vllm_omni_launcher generate` against the stub server with --url (a server it did not start)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

import frame_code
from shared_stubs import KEY, T2V_KEYED


def _cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_omni_launcher", "generate", *args], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=900)


def test_generate_with_url_writes_mp4_npy_and_report(tmp_path, stub_pool):
    with stub_pool.lease(T2V_KEYED) as (stub,):      # keyed: the key comes from the local config (env here)
        out = _cli("--url", stub.url, "--prompt", "a fox", "--width", "64", "--height", "64", "--frames", "5",
                   "--fps", "10", "--steps", "2", "--seed", "3", "--out", str(tmp_path / "clip.mp4"),
                   "--frames-npy", str(tmp_path / "f.npy"), "--report-json", str(tmp_path / "r.json"),
                   env={"VLLM_OMNI_LAUNCHER_REMOTE_URL": stub.url, "VLLM_OMNI_LAUNCHER_REMOTE_API_KEY": KEY})
    assert out.returncode == 0, out.stderr
    assert KEY not in out.stdout + out.stderr
    frames = np.load(tmp_path / "f.npy")
    assert frames.shape == (5, 64, 64, 3) and frames.dtype == np.float32
    assert [frame_code.decode(f) for f in frames] == [(i, 3) for i in range(5)]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["fps"] == 10.0 and (tmp_path / "clip.mp4").read_bytes()[4:8] == b"ftyp"
    for key in ("submit", "queued", "running", "job_done", "detected", "downloaded", "decoded"):
        assert key in report["timings"]


def test_generate_url_takes_a_configured_name_or_a_url_the_way_remote_server_does(tmp_path, stub_pool):
    """--url NAME reaches the configured server with its key; a typed URL is trimmed (spaces, /v1/) and gets
    the key configured for its origin. Both: the Remote Server node's rule (remote_servers.remote_target)."""
    config = tmp_path / "launcher.json"
    common = ["--prompt", "a fox", "--width", "64", "--height", "64", "--frames", "5", "--fps", "10", "--steps", "1",
              "--seed", "3"]
    with stub_pool.lease(T2V_KEYED) as (stub,):
        config.write_text(json.dumps({"remote_servers": {"box": {"url": stub.url, "api_key_env": "BOX_KEY"}}}))
        env = {"VLLM_OMNI_LAUNCHER_CONFIG": str(config), "BOX_KEY": KEY}
        named = _cli("--url", "box", *common, "--out", str(tmp_path / "named.mp4"), env=env)
        typed = _cli("--url", f"  {stub.url}/v1/ ", *common, "--out", str(tmp_path / "typed.mp4"), env=env)
    for out in (named, typed):
        assert out.returncode == 0, out.stderr
        assert KEY not in out.stdout + out.stderr
    assert (tmp_path / "named.mp4").read_bytes()[4:8] == (tmp_path / "typed.mp4").read_bytes()[4:8] == b"ftyp"


def test_generate_url_refuses_an_image_the_served_model_does_not_take_before_reading_it(tmp_path, stub_pool):
    """Without --family the model is the server's: its inputs rule runs once the server has said it (T2V-A14B
    takes no start image), before --image is opened, so a path that does not exist is not what is reported."""
    missing = tmp_path / "missing.png"
    with stub_pool.lease(T2V_KEYED) as (stub,):
        out = _cli("--url", stub.url, "--prompt", "a fox", "--seed", "3", "--image", str(missing),
                   env={"VLLM_OMNI_LAUNCHER_REMOTE_URL": stub.url, "VLLM_OMNI_LAUNCHER_REMOTE_API_KEY": KEY})
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("error: Wan2.2 T2V-A14B does not take --image. ")
    assert "no such file" not in out.stderr and "Fix: leave --image out" in out.stderr


def test_generate_refuses_a_url_that_is_not_http_before_sending_anything():
    out = _cli("--url", "ftp://127.0.0.1:9", "--family", "ti2v_5b", "--prompt", "x", env={})
    assert out.returncode == 1 and "is not a usable server URL" in out.stderr and "http://" in out.stderr
    assert "Traceback" not in out.stderr


# `generate` starting its own server through the Supervisor (launch options instead of --url):
# test_generate_auto.py runs that path end to end (generate_cmd.run -> launch_from_args -> Supervisor
# start -> job -> stop); only its model comes from auto instead of --model, which the `argv` tests
# (tests/unit) resolve through the same launch_from_args.


def test_generate_reports_a_bad_frame_count_before_starting_anything(tmp_path):
    out = _cli("--url", "http://127.0.0.1:9", "--family", "ti2v_5b", "--prompt", "x", "--frames", "10",
               env={})
    assert out.returncode == 1 and "set --frames to 9" in out.stderr and "Traceback" not in out.stderr
