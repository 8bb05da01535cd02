"""planner.doctor on this GPU-less machine, and with a fake NVML module standing in for the GPUs."""
from __future__ import annotations

import json
import os
import socket
import subprocess
from types import SimpleNamespace

import pytest

from fake_nvml import FakeGpu, FakeNvml, broken_nvml
from vllm_omni_launcher.planner import doctor as doctor_mod
from vllm_omni_launcher.planner.doctor import run_doctor
from vllm_omni_launcher.planner.doctor_report import PROBLEM, UNCHECKED, WARNING
from vllm_omni_launcher.planner.gpus import query_gpus
from vllm_omni_launcher.server.config.local_config import LocalConfig



def make_folder(root, kind="t2v"):
    """A weight-less Wan2.2-shaped Diffusers folder (safetensors headers only)."""
    import struct
    root.mkdir(parents=True, exist_ok=True)
    index = {"_class_name": "WanPipeline", "expand_timesteps": kind == "ti2v",
             "transformer_2": [None, None] if kind == "ti2v" else ["diffusers", "WanTransformer3DModel"]}
    (root / "model_index.json").write_text(json.dumps(index))
    parts = {"transformer": "diffusion_pytorch_model", "text_encoder": "model", "vae": "diffusion_pytorch_model"}
    if kind != "ti2v":
        parts["transformer_2"] = "diffusion_pytorch_model"
    for sub, stem in parts.items():
        raw = json.dumps({"w": {"dtype": "BF16", "shape": [10, 10], "data_offsets": [0, 0]}}).encode()
        (root / sub).mkdir(exist_ok=True)
        (root / sub / f"{stem}.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    for sub in ("tokenizer", "scheduler"):
        (root / sub).mkdir(exist_ok=True)
    return root


def gpu_pair(names=("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090"), total_gib=24.0, free_gib=(23.5, 23.5),
             procs=None, cc=(8, 9), **machine):
    """NVML of a machine with these GPUs (a GeForce pair unless told), `procs` {index: [(pid, GiB)]}."""
    return FakeNvml([FakeGpu(name=name, total_gib=total_gib, free_gib=free, cc=cc, processes=(procs or {}).get(i, ()))
                     for i, (name, free) in enumerate(zip(names, free_gib))], **machine)


def fake_runner(versions):
    def run(cmd, capture_output=True, text=True, timeout=None):
        assert cmd[1] == "-c" and "DOCTOR_JSON" in cmd[2]
        return subprocess.CompletedProcess(cmd, 0, stdout="DOCTOR_JSON " + json.dumps(versions), stderr="")
    return run


GOOD_ENV = {"python": "3.12.1", "vllm": "0.30.0", "vllm-omni": "0.30.0", "torch": "2.13.0+cu130",
            "diffusers": "0.40.0", "torch_cuda": "13.0", "cuda_available": True, "cuda_devices": 2}


@pytest.fixture
def server_env(tmp_path):
    env = tmp_path / "venv"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("#!/bin/sh\n")
    return LocalConfig(server_env=str(env), data_dir=str(tmp_path / "data"))


def test_no_gpu_machine_says_what_it_could_not_check(server_env):
    report = run_doctor(None, config=server_env, nvml=broken_nvml(), runner=fake_runner(
        dict(GOOD_ENV, cuda_available=False, cuda_devices=0)))
    unchecked = {c.name for c in report.unchecked}
    assert {"gpus", "peer_to_peer", "own_gpu_memory", "model", "server_cuda"} <= unchecked
    assert "NVML" in report.check("gpus").summary and report.check("gpus").fix
    assert report.ok
    text = report.text()
    assert "could not run" in text and "gpus" in text
    json.dumps(report.to_dict())


def test_real_machine_without_gpu_or_pynvml_does_not_crash(server_env):
    """This machine has no GPU: the real NVML (if nvidia-ml-py is installed) cannot start."""
    gpus, reason = query_gpus()
    if gpus:
        pytest.skip("this machine has a GPU")
    assert reason
    report = run_doctor(None, config=server_env, runner=fake_runner(GOOD_ENV))
    assert report.check("gpus").status == UNCHECKED


def test_fake_nvml_geforce_pair_without_p2p_and_own_memory(server_env):
    nvml = gpu_pair(procs={0: [(os.getpid(), 3.2), (4242, 1.0)]})
    report = run_doctor(None, config=server_env, nvml=nvml, runner=fake_runner(GOOD_ENV))
    gpus = report.check("gpus")
    assert gpus.status == "ok" and "2 GPU(s), driver 580.65.06" in gpus.summary and "CC 8.9" in gpus.summary
    p2p = report.check("peer_to_peer")
    assert p2p.status == WARNING and "not supported" in p2p.summary and "CFG parallel" in p2p.fix
    assert "parallel_mode cfg" in p2p.fix and "--parallel cfg=2" in p2p.fix and "--cfg-parallel-size" not in p2p.fix
    assert "GeForce" in p2p.fix and "across CPU sockets" in p2p.summary
    own = report.check("own_gpu_memory")
    assert own.status == WARNING and "3.2 GiB" in own.summary
    assert report.check("server_env").status == "ok" and report.check("server_cuda").status == "ok"
    assert nvml.shutdowns >= 1
    assert len(report.gpus) == 2 and report.gpus[0].is_geforce


def test_fake_nvml_datacenter_pair_with_nvlink(server_env):
    nvml = gpu_pair(names=("NVIDIA H200", "NVIDIA H200"), total_gib=139.8, free_gib=(139.0, 60.0), p2p_read_ok=True,
                    nvlink=True)
    report = run_doctor(None, config=server_env, nvml=nvml, runner=fake_runner(GOOD_ENV))
    assert report.check("peer_to_peer").status == "ok" and "NVLink" in report.check("peer_to_peer").summary
    assert report.check("gpus").status == WARNING and "GPU 1" in report.check("gpus").fix   # someone holds 80 GiB
    assert report.check("own_gpu_memory").status == "ok"


def test_old_gpu_is_a_problem(server_env):
    report = run_doctor(None, config=server_env, nvml=gpu_pair(names=("Tesla V100",), free_gib=(23.0,), cc=(7, 0)),
                        runner=fake_runner(GOOD_ENV))
    assert report.check("gpus").status == PROBLEM and not report.ok


@pytest.mark.parametrize("env,status,words", [
    (dict(GOOD_ENV, vllm="0.26.0"), PROBLEM, "major.minor differ"),
    (dict(GOOD_ENV, **{"vllm-omni": None}), PROBLEM, "vllm-omni not installed"),
    (dict(GOOD_ENV, torch="2.11.0"), WARNING, "pins torch 2.13"),
    (dict(GOOD_ENV, vllm="0.26.0", **{"vllm-omni": "0.26.0", "torch": "2.11.0", "diffusers": "0.38.0"}), "ok", "match"),
])
def test_server_env_versions(server_env, env, status, words):
    report = run_doctor(None, config=server_env, nvml=broken_nvml(), runner=fake_runner(env))
    c = report.check("server_env")
    assert c.status == status and words in c.summary, c


def test_server_env_missing_and_failing(tmp_path, monkeypatch):
    monkeypatch.setattr(doctor_mod.shutil, "which", lambda name: None)
    report = run_doctor(None, config=LocalConfig(data_dir=str(tmp_path)), nvml=broken_nvml())
    assert report.check("server_env").status == UNCHECKED and "no server environment is configured" in report.check("server_env").summary
    cfg = LocalConfig(server_env=str(tmp_path / "nope"), data_dir=str(tmp_path))
    assert run_doctor(None, config=cfg, nvml=broken_nvml()).check("server_env").status == PROBLEM

    def boom(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, 1)
    env = tmp_path / "v"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("")
    report = run_doctor(None, config=LocalConfig(server_env=str(env), data_dir=str(tmp_path)), nvml=broken_nvml(),
                        runner=boom)
    assert report.check("server_env").status == PROBLEM and "did not answer" in report.check("server_env").summary


def test_server_env_real_subprocess(tmp_path):
    """The version script really runs in a python (here: this one, which has no vllm)."""
    import sys
    env = tmp_path / "v"
    (env / "bin").mkdir(parents=True)
    os.symlink(sys.executable, env / "bin" / "python")
    report = run_doctor(None, config=LocalConfig(server_env=str(env), data_dir=str(tmp_path)), nvml=broken_nvml())
    c = report.check("server_env")
    assert c.status == PROBLEM and "not installed" in c.summary and "pip install vllm==0.30.0" in c.fix


def test_model_folder_checks(tmp_path, server_env):
    good = make_folder(tmp_path / "good")
    report = run_doctor(str(good), config=server_env, nvml=broken_nvml(), runner=fake_runner(GOOD_ENV))
    assert report.check("model").status == "ok" and "WanPipeline" in report.check("model").summary
    bad = make_folder(tmp_path / "bad")
    for f in (bad / "transformer_2").glob("*"):
        f.unlink()
    (bad / "transformer_2").rmdir()
    (bad / "vae" / "x.safetensors.incomplete").write_text("")
    c = run_doctor(str(bad), config=server_env, nvml=broken_nvml(), runner=fake_runner(GOOD_ENV)).check("model")
    assert c.status == PROBLEM and "transformer_2" in c.summary and "incomplete" in c.summary
    assert "huggingface-cli download" in c.fix
    not_wan = tmp_path / "other"
    not_wan.mkdir()
    (not_wan / "model_index.json").write_text(json.dumps({"_class_name": "FluxPipeline"}))
    assert run_doctor(str(not_wan), config=server_env, nvml=broken_nvml(),
                      runner=fake_runner(GOOD_ENV)).check("model").status == PROBLEM


def test_hf_download_needs_disk(tmp_path, server_env, monkeypatch):
    cfg = LocalConfig(server_env=server_env.server_env, data_dir=str(tmp_path),
                      extra_env={"HF_HOME": str(tmp_path / "hf")})
    report = run_doctor("Wan-AI/Wan2.2-T2V-A14B-Diffusers", config=cfg, nvml=broken_nvml(),
                        runner=fake_runner(GOOD_ENV))
    assert "not downloaded yet" in report.check("model").summary
    monkeypatch.setattr(doctor_mod.shutil, "disk_usage", lambda p: SimpleNamespace(total=0, used=0, free=10 * 10**9))
    report = run_doctor("Wan-AI/Wan2.2-T2V-A14B-Diffusers", config=cfg, nvml=broken_nvml(),
                        runner=fake_runner(GOOD_ENV))
    assert report.check("disk").status == PROBLEM and "HF_HOME" in report.check("disk").fix


def test_port_taken_and_free(server_env):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        report = run_doctor(None, config=server_env, nvml=broken_nvml(), runner=fake_runner(GOOD_ENV), port=port)
        assert report.check("port").status == PROBLEM and "taken" in report.check("port").summary
    free = run_doctor(None, config=server_env, nvml=broken_nvml(), runner=fake_runner(GOOD_ENV)).check("port")
    assert free.status == "ok"
