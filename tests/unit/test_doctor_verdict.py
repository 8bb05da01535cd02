"""The doctor's verdict comes first and is true for this box: a GPU box without a server
environment has a problem, a client-only box (no NVIDIA GPU) does not; warnings are counted;
host RAM is judged for the model checked; Diffusers folders Load Model leaves out are listed with
why. NVML is a stand-in module (the GPU is what it fakes); psutil's reading is fixed."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from vllm_omni_launcher.planner import doctor as doctor_mod
from vllm_omni_launcher.planner.doctor import run_doctor
from vllm_omni_launcher.planner.doctor_report import CLIENT_ONLY, GPU_BOX, OK, PROBLEM, WARNING
from vllm_omni_launcher.planner.gpus import GIB
from vllm_omni_launcher.server.config.local_config import LocalConfig

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
SETUP_FIX = "run `python -m vllm_omni_launcher setup` on the GPU machine"


class _NvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__("NVML Shared Library Not Found")
        self.value = value


class NoDriver:
    """NVML of a machine without the NVIDIA driver."""

    def nvmlInit(self):
        raise _NvmlError(12)


class OneH100:
    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlSystemGetDriverVersion(self):
        return "580.65.06"

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=int(80 * GIB), free=int(79.5 * GIB))

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return (9, 0)

    def nvmlDeviceGetUUID(self, h):
        return "GPU-0"

    def nvmlDeviceGetComputeRunningProcesses_v3(self, h):
        return []


@pytest.fixture()
def no_server_env(tmp_path, monkeypatch):
    """A fresh box before `setup`: nothing configured, no default server environment, no vllm on PATH."""
    monkeypatch.setattr(doctor_mod.shutil, "which", lambda name: None)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    return LocalConfig(data_dir=str(tmp_path / "data"))


def _ram(monkeypatch, available_gib: float) -> None:
    import psutil
    monkeypatch.setattr(psutil, "virtual_memory",
                        lambda: SimpleNamespace(total=int(128 * GIB), available=int(available_gib * GIB)))


def test_a_gpu_box_before_setup_has_a_problem_and_says_so_first(no_server_env, monkeypatch):
    _ram(monkeypatch, 120)
    report = run_doctor(None, config=no_server_env, nvml=OneH100())
    assert report.role == GPU_BOX and not report.ok
    assert report.check("server_env").status == PROBLEM
    first, second, third = report.text().splitlines()[:3]
    assert first == "FAIL: 1 problem (server_env)"        # short: the Doctor node shows about 40 characters
    assert second == "GPU box: 1 GPU(s), it can run a local server."
    assert third.startswith(f"First fix, server_env: {SETUP_FIX}")


def test_a_client_only_box_needs_no_server_environment(no_server_env, monkeypatch):
    _ram(monkeypatch, 8)               # far too little for offload, which does not run here
    report = run_doctor(None, config=no_server_env, nvml=NoDriver())
    assert report.role == CLIENT_ONLY and report.ok
    assert report.check("server_env").status == OK and report.check("host_ram").status == OK
    assert report.text().splitlines()[:2] == [
        "OK: no problems",
        "Client-only box: no NVIDIA GPU, so it cannot run a local server; use a server on a GPU machine (Remote "
        "Server node, or `generate --url URL`)."]


def test_warnings_are_counted_next_to_the_problems(no_server_env, monkeypatch):
    _ram(monkeypatch, 10)
    report = run_doctor(TI2V, config=no_server_env, nvml=OneH100())
    lines = report.text().splitlines()
    assert lines[0] == "FAIL: 1 problem (server_env); 1 warning (host_ram)" and lines[1].startswith("GPU box")
    assert lines[-1].startswith("1 problem(s), 1 warning(s), ")
    statuses = [line[1:5] for line in lines if line.startswith("[")]
    assert statuses == sorted(statuses, key=["FAIL", "WARN", "--  ", "ok  "].index)   # worst first


def test_host_ram_is_judged_for_the_model_checked(no_server_env, monkeypatch):
    _ram(monkeypatch, 40)              # enough for TI2V-5B's offload (about 20 GiB), not for A14B's (about 64)
    ti2v = run_doctor(TI2V, config=no_server_env, nvml=OneH100()).check("host_ram")
    assert ti2v.status == OK and "A14B" not in ti2v.summary + ti2v.fix
    a14b = run_doctor("Wan-AI/Wan2.2-T2V-A14B-Diffusers", config=no_server_env, nvml=OneH100()).check("host_ram")
    assert a14b.status == WARNING and a14b.fix.startswith("CPU offload of Wan2.2 T2V-A14B pins about 64 GiB")


def test_folders_load_model_leaves_out_are_listed_with_why(no_server_env, monkeypatch, tmp_path):
    _ram(monkeypatch, 120)
    root = tmp_path / "diffusers"
    good = root / "Wan-AI" / "Wan2.2-TI2V-5B-Diffusers"
    sdxl = root / "sdxl-base"
    broken = root / "half-downloaded"
    for folder in (good, sdxl, broken):
        folder.mkdir(parents=True)
    (good / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline", "expand_timesteps": True}))
    (sdxl / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionXLPipeline"}))
    (broken / "model_index.json").write_text('{"_class_name": "WanPi')
    check = run_doctor(None, config=no_server_env, nvml=OneH100(), model_roots=[root]).check("local_models")
    assert check.status == WARNING
    assert "local/Wan-AI/Wan2.2-TI2V-5B-Diffusers: Wan2.2 TI2V-5B" in check.summary
    assert f"{sdxl}: not listed, '{sdxl}' holds a StableDiffusionXLPipeline pipeline, not Wan2.2" in check.summary
    assert f"{broken}: not listed, Cannot read {broken / 'model_index.json'}" in check.summary


def test_the_doctor_command_exits_4_on_a_gpu_box_before_setup(no_server_env, monkeypatch, capsys):
    from vllm_omni_launcher.cli import main
    _ram(monkeypatch, 120)
    monkeypatch.setattr(doctor_mod, "open_nvml", lambda nvml=None: (OneH100(), None, False))
    assert main(["doctor"]) == 4
    assert capsys.readouterr().out.startswith("FAIL: 1 problem (server_env)\nGPU box")
