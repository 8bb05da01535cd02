"""The planner's peaks for the pipelines beyond plain Wan2.2 (VACE-14B, VACE-1.3B, S2V-14B, FastWan TI2V-5B) on
the vLLM-Omni 0.30 line, against the real server run through our templates in a real ComfyUI on one H100 80 GB
with real-size random weights (bench/results/h100-wan-pipelines-vllm-omni-0.30/): each job's NVML peak less
ComfyUI's own context (recorded before the runs). The coefficients were fitted on the template shape (VACE's
encode copies on VACE-1.3B's; nothing else); the held-out shape of each pipeline was never used."""
from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import pytest

from vllm_omni_launcher.models.families import PIPELINE_FAMILIES
from vllm_omni_launcher.planner.memory import RequestShape, plan
from vllm_omni_launcher.server.launch.spec import LaunchSpec

RESULTS = Path(__file__).resolve().parents[2] / "bench/results/h100-wan-pipelines-vllm-omni-0.30"
CARD_GIB = 81559 / 1024          # the H100's NVML total (report["machine"])
FOLDERS = {"vace_14b": "vace-14b", "vace_1_3b": "vace-1.3b", "s2v_14b": "s2v-14b", "fastwan_ti2v_5b": "fastwan-ti2v-5b"}


def _report(key: str) -> dict:
    return json.loads((RESULTS / FOLDERS[key] / "report.json").read_text())


def _plan(key: str, shape: list[int]):
    spec = LaunchSpec(PIPELINE_FAMILIES[key].hf_id, gpus=(0,))
    return plan(spec, RequestShape(*shape), [CARD_GIB], host_available_gib=None, server_version=(0, 30))


def _jobs() -> list[tuple[str, str]]:
    return [(key, run["run"]) for key in FOLDERS for run in _report(key)["runs"]]


@pytest.mark.parametrize("key, run", _jobs())
def test_each_pipeline_job_peak_is_within_10_percent_of_the_h100_run(key, run):
    report = _report(key)
    job = next(r for r in report["runs"] if r["run"] == run)
    assert job["status"] == "success" and job["sink"]["batch"] == job["frames_expected"]
    measured = (job["nvml_peak_mib"] - report["nvml_mib_comfyui_idle"]) / 1024
    predicted = _plan(key, job["shape"]).peak_gib
    assert abs(predicted / measured - 1) <= 0.10, (key, run, predicted, measured)


def test_every_pipeline_has_a_held_out_job_larger_in_tokens_than_its_template():
    for key in FOLDERS:
        report = _report(key)
        runs = {r["run"]: r for r in report["runs"]}
        assert "held-out" in runs, key
        template = next(r for r in report["runs"] if r["run"] != "held-out")
        assert runs["held-out"]["shape"] != template["shape"] and runs["held-out"]["tokens"] > template["tokens"]


def _server_loaded_gib() -> dict[str, float]:
    """vLLM-Omni's own "Model loading took X GiB" line of each pipeline's server log."""
    found: dict[str, float] = {}
    with tarfile.open(RESULTS / "logs" / "logs-after-s2v-14b.tgz") as tar:
        for member in tar.getmembers():
            name = Path(member.name).name
            key = next((k for k, folder in FOLDERS.items() if name.startswith(folder + "-fullsize-")), None)
            if key is None or not member.isfile():
                continue
            text = tar.extractfile(member).read().decode("utf-8", "replace")
            found[key] = float(re.search(r"Model loading took ([0-9.]+) GiB", text).group(1))
    return found


def test_the_resident_weights_match_what_each_server_logged_as_loaded():
    # S2V's second token embedding (its converted T5 checkpoint) is what brings it to the server's figure
    loaded = _server_loaded_gib()
    assert set(loaded) == set(FOLDERS)
    for key, gib in loaded.items():
        resident = _plan(key, list(_report(key)["runs"][0]["shape"])).gpus[0].phases["resident"]
        assert abs(resident / gib - 1) <= 0.01, (key, resident, gib)


def test_vace_counts_the_hints_of_every_vace_block():
    terms = {t.name: t for t in _plan("vace_14b", [832, 480, 81]).gpus[0].terms}
    hints = terms["VACE hints"]
    assert hints.phase == "denoise" and "8 VACE blocks" in hints.note
    tokens = 21 * 30 * 52          # (81-1)/4+1 latent frames x (480/8/2) x (832/8/2)
    assert hints.gib == pytest.approx(8 * tokens * 5120 * 2 / 2**30)
    assert "VACE hints" not in {t.name for t in _plan("fastwan_ti2v_5b", [1280, 704, 121]).gpus[0].terms}
