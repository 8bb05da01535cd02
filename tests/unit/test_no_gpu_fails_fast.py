"""A local launch on a machine without an NVIDIA GPU (or naming GPUs it lacks) is refused at once,
before the server environment is probed or anything starts, by the one function every launch
path resolves through (Local Server, `generate`, `serve`), naming the way out; `argv`, which
starts nothing, still prints the command. A GPU count or id list from a workflow is capped before
any list is built. NVML stands in as a fake module (the GPU is what it fakes)."""
from __future__ import annotations

import sys
import tracemalloc

import pytest

from comfy_standin import ComfyStandIn, run_node
from fake_nvml import FakeGpu, FakeNvml
from vllm_omni_launcher.cli import main
from vllm_omni_launcher.errors import LauncherError, SpecError
from vllm_omni_launcher.planner.gpus import MAX_GPUS, parse_gpu_memory, scan_gpus, select_gpus
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV, NO_GPU, ServingChoice
from vllm_omni_launcher.server.config.config_values import shown
from vllm_omni_launcher.server.launch import versions
from vllm_omni_launcher.server.config.local_config import LocalConfig

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
NO_GPU_TEXT = (
    "This machine has no NVIDIA GPU, so it cannot run a local vLLM-Omni server. Why: NVML could not start "
    "(NVML Shared Library Not Found): no NVIDIA driver or no GPU on this machine. Fix: run the server on the GPU "
    "machine (`python -m vllm_omni_launcher serve --model MODEL` there) and use it from here: the Remote Server "
    "node in ComfyUI, or `generate --url URL` on the command line; if this machine does have GPUs that NVML "
    "cannot see, set VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB to their sizes (e.g. 80 or 24,24).")


@pytest.fixture()
def machine(monkeypatch):
    """Install a fake NVML as `pynvml`; the server environment's probe must never run."""
    monkeypatch.delenv(GPU_MEMORY_ENV, raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def probed(*_a, **_k):
        raise AssertionError("the server environment was probed before the GPU check")
    monkeypatch.setattr(versions, "detect", probed)

    def use(init_error: "int | None" = None, count: int = 0) -> None:
        monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([FakeGpu()] * count, init_error=init_error))
    return use


@pytest.mark.parametrize("init_error,count", [(12, 0), (9, 0), (None, 0)])
def test_nvml_saying_no_gpu_is_told_apart_from_not_knowing(machine, init_error, count):
    machine(init_error=init_error, count=count)
    scan = scan_gpus()
    assert scan.gpus == [] and scan.absent


def test_no_permission_is_not_taken_for_no_gpu(machine):
    machine(init_error=4)
    assert not scan_gpus().absent          # NVML could not tell: the launch is not refused for it


def test_the_local_server_node_refuses_a_machine_without_gpus_at_once(machine):
    machine(init_error=12)
    with ComfyStandIn() as comfy:
        model = run_node("VLLMOmniLoadModel", TI2V)[0]
        with pytest.raises(LauncherError) as err:
            run_node("VLLMOmniLocalServer", model, ServingChoice(), unique_id="srv")
    assert err.value.kind == NO_GPU and err.value.setting == "gpus"
    assert str(err.value) == NO_GPU_TEXT
    assert not any("Starting" in text for text, _ in comfy.texts)


@pytest.mark.parametrize("argv", [
    ["generate", "--prompt", "a fox"],                                   # the model auto picks
    ["generate", "--model", TI2V, "--prompt", "a fox", "--gpus", "0"],
    ["serve", "--model", TI2V],
])
def test_generate_and_serve_refuse_a_machine_without_gpus_first(machine, capsys, tmp_path, monkeypatch, argv):
    machine(init_error=12)
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err == f"error: {NO_GPU_TEXT}\n"          # the one line, before any "model:" or "starting" line
    assert not list(tmp_path.iterdir())


def test_argv_still_prints_the_command_on_a_machine_without_gpus(machine, capsys):
    machine(init_error=12)
    assert main(["argv", "--model", TI2V, "--parallel", "ulysses=2", "--gpus", "0,1"]) == 0
    assert "--usp 2" in capsys.readouterr().out


def test_gpu_ids_this_machine_lacks_are_refused_naming_the_way_out(machine):
    machine(count=1)
    with pytest.raises(SpecError) as err:
        ServingChoice(gpus="0,1", parallel_mode="ulysses", parallel_degree=2).resolve(TI2V, LocalConfig())
    assert str(err.value) == (
        "GPU 1 is not on this machine. Why: it shows 1 GPU(s): 0. Fix: select GPUs from 0 (or all / count=N), or "
        "run the server on the GPU machine (`python -m vllm_omni_launcher serve --model MODEL` there) and use it "
        "from here: the Remote Server node in ComfyUI, or `generate --url URL` on the command line.")


@pytest.mark.parametrize("text", ["count=1000000000", "count=0", "count=-3", f"count={MAX_GPUS + 1}"])
def test_a_gpu_count_is_capped_before_any_list_is_built(text):
    with pytest.raises(SpecError) as err:
        select_gpus(text, [])              # no GPU visible: the ids would be made up to the count
    assert err.value.setting == "gpus" and str(err.value).startswith(f'gpus got the string "{text}", a GPU count out '
                                                                     "of range")


def test_a_gpu_id_list_is_capped_before_it_is_split_or_converted():
    ids = ",".join(map(str, range(100_000)))        # the gpus widget is the workflow's: any length arrives
    tracemalloc.start()
    try:
        with pytest.raises(SpecError) as err:
            select_gpus(ids, [])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert err.value.setting == "gpus"
    assert str(err.value).startswith(f"gpus got {shown(ids)}, which lists more than {MAX_GPUS} GPU ids. Why: ")
    # copies of the text (stripped, lower-cased) at most: split whole, its 100,000 ids alone take over 10 times it
    assert peak < 4 * len(ids)
    assert select_gpus(",".join(map(str, range(MAX_GPUS))), []) == tuple(range(MAX_GPUS))   # the cap itself passes


def test_a_size_list_is_capped_too():
    with pytest.raises(ValueError) as err:
        parse_gpu_memory("1000000000x80")
    assert f"more than {MAX_GPUS} GPUs" in str(err.value)
    assert parse_gpu_memory("2x80") == [80.0, 80.0]
