"""The doctor's verdict comes first and is true for this box: a GPU box without a server
environment has a problem, a client-only box (no NVIDIA GPU) does not; warnings are counted;
host RAM is judged for the model checked; Diffusers folders Load Model leaves out are listed with
why. NVML is a stand-in module (the GPU is what it fakes); psutil's reading is fixed."""
from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest

from fake_nvml import NVML_ERROR_LIBRARY_NOT_FOUND, FakeGpu, FakeNvml
from vllm_omni_launcher.planner import doctor as doctor_mod
from vllm_omni_launcher.planner.doctor import run_doctor
from vllm_omni_launcher.planner.doctor_report import CLIENT_ONLY, GPU_BOX, OK, PROBLEM, WARNING, Check, DoctorReport
from vllm_omni_launcher.planner.gpus import GIB
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.config.server_env import SETUP_COMMAND

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
SETUP_FIX = f"run `{SETUP_COMMAND}` on the GPU machine"


def one_h100():
    return FakeNvml([FakeGpu(free_gib=79.5)])


def no_driver():
    """NVML of a machine without the NVIDIA driver."""
    return FakeNvml(init_error=NVML_ERROR_LIBRARY_NOT_FOUND)


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
    report = run_doctor(None, config=no_server_env, nvml=one_h100())
    assert report.role == GPU_BOX and not report.ok
    assert report.check("server_env").status == PROBLEM
    first, second, third = report.text().splitlines()[:3]
    assert first == "FAIL: 1 problem (server_env)"        # short: the Doctor node shows about 40 characters
    assert second == "GPU box: 1 GPU(s), it can run a local server."
    assert third.startswith(f"First fix, server_env: {SETUP_FIX}")


def test_a_client_only_box_needs_no_server_environment(no_server_env, monkeypatch):
    _ram(monkeypatch, 8)               # far too little for offload, which does not run here
    report = run_doctor(None, config=no_server_env, nvml=no_driver())
    assert report.role == CLIENT_ONLY and report.ok
    assert report.check("server_env").status == OK and report.check("host_ram").status == OK
    assert report.text().splitlines()[:2] == [
        "OK: no problems",
        "Client-only box: no NVIDIA GPU, so it cannot run a local server; use a server on a GPU machine (Remote "
        "Server node, or `generate --url URL`)."]


def test_the_verdict_names_the_problems_and_the_last_line_counts_the_warnings(no_server_env, monkeypatch):
    _ram(monkeypatch, 10)
    report = run_doctor(TI2V, config=no_server_env, nvml=one_h100())
    lines = report.text().splitlines()
    assert lines[0] == "FAIL: 1 problem (server_env)" and lines[1].startswith("GPU box")
    assert lines[-1].startswith("1 problem(s), 1 warning(s), ")
    statuses = [line[1:5] for line in lines if line.startswith("[")]
    assert statuses == sorted(statuses, key=["FAIL", "WARN", "--  ", "ok  "].index)   # worst first


@pytest.mark.parametrize("statuses,first", [
    ([PROBLEM, PROBLEM, PROBLEM, WARNING, WARNING, WARNING], "FAIL: 3 problems"),
    ([PROBLEM, WARNING], "FAIL: 1 problem (check_0)"),
    ([WARNING, WARNING], "OK: 2 warnings (check_0, check_1)"),
    ([WARNING] * 5, "OK: 5 warnings"),
])
def test_the_verdict_line_stays_short_however_many_findings(statuses, first):
    report = DoctorReport([Check(f"check_{i}" if len(statuses) < 5 else f"a_long_check_name_{i}", status, "")
                           for i, status in enumerate(statuses)], role=CLIENT_ONLY)
    line = report.verdict().splitlines()[0]
    assert line == first and len(line) <= 40          # the Doctor node at its default size shows about 40


def test_host_ram_is_judged_for_the_model_checked(no_server_env, monkeypatch):
    _ram(monkeypatch, 40)              # enough for TI2V-5B's offload (about 20 GiB), not for A14B's (about 64)
    ti2v = run_doctor(TI2V, config=no_server_env, nvml=one_h100()).check("host_ram")
    assert ti2v.status == OK and "A14B" not in ti2v.summary + ti2v.fix
    a14b = run_doctor("Wan-AI/Wan2.2-T2V-A14B-Diffusers", config=no_server_env, nvml=one_h100()).check("host_ram")
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
    check = run_doctor(None, config=no_server_env, nvml=one_h100(), model_roots=[root]).check("local_models")
    assert check.status == WARNING
    assert "local/Wan-AI/Wan2.2-TI2V-5B-Diffusers: Wan2.2 TI2V-5B" in check.summary
    assert f"{sdxl}: not listed, '{sdxl}' holds a StableDiffusionXLPipeline pipeline, not Wan2.2" in check.summary
    assert f"{broken}: not listed, Cannot read {broken / 'model_index.json'}" in check.summary


def test_the_doctor_command_exits_4_on_a_gpu_box_before_setup(no_server_env, monkeypatch, capsys):
    from vllm_omni_launcher.cli import main
    _ram(monkeypatch, 120)
    monkeypatch.setitem(sys.modules, "pynvml", one_h100())
    assert main(["doctor"]) == 4
    assert capsys.readouterr().out.startswith("FAIL: 1 problem (server_env)\nGPU box")


def test_a_client_only_box_does_not_judge_the_disk_for_a_download_it_never_makes(no_server_env, monkeypatch):
    _ram(monkeypatch, 8)
    monkeypatch.setattr(doctor_mod.shutil, "disk_usage", lambda p: SimpleNamespace(total=0, used=0, free=10**9))
    report = run_doctor("Wan-AI/Wan2.2-T2V-A14B-Diffusers", config=no_server_env, nvml=no_driver())
    assert report.role == CLIENT_ONLY and report.ok, report.text()
    assert "disk" not in {c.name for c in report.checks}
    assert "this client-only box never does" in report.check("model").summary


def test_gpu_sizes_from_the_variable_make_a_gpu_box_and_say_where_they_came_from(no_server_env, monkeypatch):
    _ram(monkeypatch, 120)
    monkeypatch.setenv(GPU_MEMORY_ENV, "24,24")
    report = run_doctor(None, config=no_server_env, nvml=no_driver())
    assert report.role == GPU_BOX and [g.total_gib for g in report.gpus] == [24.0, 24.0]
    assert report.text().splitlines()[1] == (f"GPU box: 2 GPU(s) (sizes from {GPU_MEMORY_ENV}), it can run a local "
                                             "server.")
    env = report.check("gpu_memory_env")
    assert env.status == OK and "NVML cannot see" in env.summary and "launches and plans use these sizes" in env.summary
    assert report.check("server_env").status == PROBLEM       # a GPU box needs one, as a launch would
    assert report.to_dict()["gpu_source"] == f"sizes from {GPU_MEMORY_ENV}"


def test_gpu_sizes_from_the_variable_that_differ_from_nvml_are_a_warning(no_server_env, monkeypatch):
    _ram(monkeypatch, 120)
    monkeypatch.setenv(GPU_MEMORY_ENV, "24")
    report = run_doctor(None, config=no_server_env, nvml=one_h100())
    env = report.check("gpu_memory_env")
    assert env.status == WARNING and f"{GPU_MEMORY_ENV}=24" in env.summary and "80.0 GiB" in env.summary
    assert f"unset {GPU_MEMORY_ENV}" in env.fix and report.to_dict()["gpu_source"] == "NVML"
    monkeypatch.setenv(GPU_MEMORY_ENV, "80")
    assert run_doctor(None, config=no_server_env, nvml=one_h100()).check("gpu_memory_env").status == OK


def test_a_bad_gpu_memory_variable_is_a_problem_naming_it(no_server_env, monkeypatch):
    _ram(monkeypatch, 120)
    monkeypatch.setenv(GPU_MEMORY_ENV, "nan")
    check = run_doctor(None, config=no_server_env, nvml=no_driver()).check("gpu_memory_env")
    assert check.status == PROBLEM and check.summary.startswith(f"{GPU_MEMORY_ENV} is not valid")
