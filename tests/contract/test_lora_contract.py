"""LoRA and sampler against the real vLLM-Omni 0.30 code (issue 13).

* Every LoRA combination the CLI and the nodes can produce: the argv is accepted by the real
  parser and resolves to the distill backend with the files in transformer order.
* The real Wan LoRA loader (the one `--lora-backend distill` runs) applies every key of a
  ComfyUI-format LoRA made for the tiny Wan2.2 transformers (lora_loader_check.py, run in the
  session's resolver process).
* The stub server (real HTTP layer and form parser, fake engine): a per-request `lora` and the
  Euler sampler pass the real form parser (a malformed lora gets upstream's own 400); the nodes
  keep one server while a per-request LoRA changes, and restart it (saying so) when a fused
  LoRA appears.
"""
from __future__ import annotations

import argparse
import json
import struct
from pathlib import Path

import pytest

from comfy_standin import ComfyStandIn, run_node
from stubserver import STUB_SCRIPT, server_python
from vllm_omni_launcher.cli.launch_options import add_launch_options, spec_from_args
from vllm_omni_launcher.client.api import VideoClient
from vllm_omni_launcher.client.request import RequestLora, VideoRequest
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.models import FAMILIES
from vllm_omni_launcher.nodes import comfy_bridge
from vllm_omni_launcher.server import registry
from vllm_omni_launcher.server.launch.loras import LoraEntry, plan_loras
from vllm_omni_launcher.server.launch.spec import LaunchSpec

T2V, TI2V = "Wan-AI/Wan2.2-T2V-A14B-Diffusers", "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
HERE = Path(__file__).resolve().parent
TINY = HERE / "fixtures" / "lora"          # the tiny Wan2.2 transformers' config.json files


def _lora_file(path: Path) -> str:
    """A ComfyUI-format LoRA file; the parser and config resolution do not read it."""
    header = json.dumps({"diffusion_model.blocks.0.self_attn.q.lora_down.weight":
                         {"dtype": "BF16", "shape": [1, 1], "data_offsets": [0, 2]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0\0")
    return str(path)


def _peft_folder(path: Path) -> str:
    path.mkdir(parents=True)
    _lora_file(path / "adapter_model.safetensors")
    (path / "adapter_config.json").write_text('{"r": 8, "lora_alpha": 8, "peft_type": "LORA"}')
    return str(path)


def _cli_argv(args: list[str]) -> list[str]:
    parser = argparse.ArgumentParser()
    add_launch_options(parser)
    spec = spec_from_args(parser.parse_args(args))
    spec.validate()
    return spec.build(["vllm"], 8000, api_key=None).argv[1:]


def test_every_lora_combination_is_accepted_and_resolved_by_the_real_parser(upstream_resolver, tmp_path):
    hi, lo = _lora_file(tmp_path / "high.safetensors"), _lora_file(tmp_path / "low.safetensors")
    cases = [  # (argv, the lora_path upstream must resolve: transformer first, transformer_2 second)
        (_cli_argv(["--model", TI2V, "--lora", hi]), [hi]),
        (_cli_argv(["--model", T2V, "--lora", hi, "--lora", f"{lo}:1"]), [hi, lo]),
        (_cli_argv(["--model", T2V, "--lora", hi]), [hi, hi]),
        (_cli_argv(["--model", T2V, "--lora", lo, "--lora", hi, "--lora-expert", "low_noise",
                    "--lora-expert", "high_noise", "--parallel", "ulysses=2", "--gpus", "0,1"]), [hi, lo]),
    ]
    a14b = FAMILIES["t2v_a14b"]
    for entries in ([LoraEntry(lo, 1.0, "low_noise"), LoraEntry(hi, 1.0, "high_noise")],
                    [LoraEntry(hi, 1.0, "both")]):           # what two (or one) LoRA nodes produce
        spec = LaunchSpec(T2V).with_changes(lora=plan_loras(entries, a14b, (0, 30)).startup)
        spec.validate()
        cases.append((spec.build(["vllm"], 8000, api_key=None).argv[1:], list(spec.lora.lora_paths)))
    results = upstream_resolver.resolve([{"argv": argv, "visible_devices": 2} for argv, _ in cases], timeout=600)
    for (argv, paths), result in zip(cases, results):
        assert result["ok"], (argv, result)
        config = result["config"]
        assert config["lora_backend"] == "distill" and config["lora_path"] == paths, (argv, config)


@pytest.mark.parametrize("model,experts", [("tiny-wan22-ti2v", ["transformer"]),
                                          ("tiny-wan22-t2v-a14b", ["transformer", "transformer_2"])])
def test_real_wan_loader_applies_every_key_of_a_comfyui_lora(model, experts, upstream_resolver, tmp_path):
    # lora_loader_check.check, in the session's resolver process (it puts back what it sets up)
    [answer] = upstream_resolver.resolve([{"call": "lora_loader_check:check",
                                          "input": {"model_dir": str(TINY / model), "out_dir": str(tmp_path)}}],
                                         timeout=900)
    assert "call_error" not in answer, answer.get("call_error")
    report = answer["experts"]
    assert sorted(report) == experts
    for expert, result in report.items():
        # 2 blocks x 10 linears x (down, up, alpha) in the file; after conversion every key is applied
        assert result["unmatched"] == [] and result["applied"] == result["keys"] > 0, (expert, result)
        assert result["changed"] > 0, (expert, result)


@pytest.fixture(scope="module")
def stub_env(tmp_path_factory):
    """The stub as the server program for this module's launches (module-scoped environment)."""
    data = tmp_path_factory.mktemp("lora-data")
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_OMNI_LAUNCHER_SERVER_CMD", f"{server_python()} {STUB_SCRIPT}")
    mp.setenv("VLLM_OMNI_LAUNCHER_DATA_DIR", str(data))
    mp.setenv("VLLM_OMNI_STUB_STEP_S", "0.05")
    mp.setenv("VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB", "80")   # the stub's GPU: NVML may show none here
    try:
        yield
    finally:
        registry.stop_all()
        mp.undo()


def _serving():
    return run_node("VLLMOmniServingConfig", 
        gpus="all", parallel_mode="none", parallel_degree=1, vae_patch_parallel=1, offload="none", fp8=False,
        vae_tiling=False, cache_backend="none", compile=False, keep_alive_minutes=0, auto_fallback=False)[0]


def test_per_request_lora_keeps_the_server_and_a_fused_one_restarts_it(stub_env, tmp_path, monkeypatch):
    loras = tmp_path / "loras"
    _peft_folder(loras / "style_a")
    _peft_folder(loras / "style_b")
    _lora_file(loras / "distill.safetensors")
    monkeypatch.setattr(comfy_bridge, "lora_folders", lambda: [loras])
    base = run_node("VLLMOmniLoadModel", TI2V)[0]
    with ComfyStandIn() as comfy:
        first = run_node("VLLMOmniLocalServer", run_node("VLLMOmniLora", base, "style_a/", 2.0, "both")[0], _serving(), unique_id="srv")[0]
        assert first.lora == RequestLora("style_a/", str(loras / "style_a"), 2.0)
        assert any("per request (no restart" in text for text, _ in comfy.texts)
        sup = registry.find(first.server_id)
        second = run_node("VLLMOmniLocalServer", run_node("VLLMOmniLora", base, "style_b/", 1.0, "both")[0], _serving(), unique_id="srv")[0]
        assert second.server_id == first.server_id and registry.find(second.server_id) is sup   # same process
        assert second.lora.path == str(loras / "style_b")

        # the per-request LoRA and the sampler go through the real form parser
        frames, fps, _ = run_node("VLLMOmniGenerateVideo", 
            second, "a fox", "", 64, 64, 9, 12.0, 3, -1.0, -1.0, -1.0, -1.0, 7, sampler="euler", unique_id="gen")
        assert tuple(frames.shape) == (9, 64, 64, 3)
        with VideoClient(sup.url, api_key=sup.api_key, served_name=sup.spec.served_name) as client:
            with pytest.raises(LauncherError) as err:
                client.generate(VideoRequest("a fox", width=64, height=64, num_frames=9,
                                             lora=RequestLora("broken", "")))
        assert "both name and path are required" in (err.value.raw or "") + str(err.value)

        comfy.texts.clear()
        fused = run_node("VLLMOmniLocalServer", run_node("VLLMOmniLora", base, "distill.safetensors", 1.0, "both")[0], _serving(), unique_id="srv")[0]
        assert fused.server_id != first.server_id and fused.lora is None
        assert registry.find(first.server_id) is None                    # the old server was replaced
        assert "--lora-path" in registry.find(fused.server_id).spec.flags()
        assert any(text.startswith("Restarting: LoRA changed") for text, _ in comfy.texts)
        assert any("fused at startup" in text for text, _ in comfy.texts)
