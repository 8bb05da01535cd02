"""The planner's T2V-A14B peak on the vLLM-Omni 0.30 line against the real server through our nodes on 80 GB
H100s, 832x480x81, one GPU, upstream's compile:
- bf16 (Serving Config `auto` -> 1 GPU, no offload), on two machines: bench/results/
  h100-a14b-native-vs-ours-vllm-omni-0.30/ours-default and h100-a14b-native-vs-ours-fast-lora-vllm-omni-0.30/
  ours-default; the same figure on two more machines in ../h100-a14b-ours-only-other-machines-vllm-omni-0.30/;
- the startup-fused 4-step LoRA pair (wan22_t2v_a14b_4step_lora: fusing adds nothing at the peak);
- FP8 DiT weights (`auto_fast`: speed fast -> 1 GPU, no offload + FP8), the second machine.
NVML sees the whole card, so ComfyUI's own idle context, recorded before the runs, is taken out."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_omni_launcher.planner.memory import RequestShape, plan
from vllm_omni_launcher.server.launch.spec import LaunchSpec, MemoryConfig

ROOT = Path(__file__).resolve().parents[2] / "bench/results"
CARD_GIB = 81559 / 1024          # the H100's NVML total (report["machine"]["gpu"])
A14B = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"


def _report(folder: str, side: str) -> dict:
    return json.loads((ROOT / folder / side / "report.json").read_text())


def _server_peaks_gib(report: dict) -> dict[str, float]:
    return {r["run"]: (r["nvml_peak_mib"] - report["nvml_mib_comfyui_idle"]) / 1024 for r in report["runs"]}


def _predicted_gib(memory: MemoryConfig) -> float:
    spec = LaunchSpec(A14B, gpus=(0,), memory=memory)
    spec.validate()
    return plan(spec, RequestShape(832, 480, 81), [CARD_GIB], host_available_gib=None, server_version=(0, 30)).peak_gib


@pytest.mark.parametrize("folder, side, memory, chose", [
    ("h100-a14b-native-vs-ours-vllm-omni-0.30", "ours-default", MemoryConfig(), "1 GPU, no offload\n"),
    ("h100-a14b-native-vs-ours-fast-lora-vllm-omni-0.30", "ours-default", MemoryConfig(), "1 GPU, no offload\n"),
    ("h100-a14b-native-vs-ours-fast-lora-vllm-omni-0.30", "ours-lora4", MemoryConfig(), "1 GPU, no offload\n"),
    ("h100-a14b-native-vs-ours-fast-lora-vllm-omni-0.30", "ours-fast", MemoryConfig(quantization="fp8"),
     "1 GPU, no offload + FP8\n"),
])
def test_a14b_one_gpu_peak_within_10_percent_of_the_h100_runs(folder, side, memory, chose):
    report = _report(folder, side)
    predicted = _predicted_gib(memory)
    peaks = _server_peaks_gib(report)
    assert len(peaks) == 2                      # the first job and the warm one
    for run, measured in peaks.items():
        assert abs(predicted / measured - 1) <= 0.10, (side, run, predicted, measured)
    assert "Recommended: " + chose in report["runs"][0]["local_server_texts"][-1]   # what the node chose there
