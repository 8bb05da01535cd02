"""LoRA, sampler and frame interpolation (issue 13), CPU side: how each LoRA is served, what the
request form carries, the spec/fingerprint, the CLI syntax, the LoRA node, the planner and Doctor."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from vllm_omni_launcher.client.request import FrameInterpolation, RequestLora, VideoRequest
from vllm_omni_launcher.errors import LauncherError, SpecError
from vllm_omni_launcher.models import FAMILIES
from comfy_standin import run_node
from vllm_omni_launcher.nodes import NODES, model_nodes
from vllm_omni_launcher.nodes.handles import ModelChoice
from vllm_omni_launcher.planner.doctor import _check_loras
from vllm_omni_launcher.planner.memory import plan as memory_plan
from vllm_omni_launcher.server.launch.loras import (LoraEntry, StartupLora, adapter_gpu_gib, find_loras, parse_cli_loras,
                                             plan_loras, startup_from_cli)
from vllm_omni_launcher.server.launch.spec import LaunchSpec

A14B, TI2V = FAMILIES["t2v_a14b"], FAMILIES["ti2v_5b"]
V30, V26 = (0, 30), (0, 26)


def _safetensors(path: Path, shapes: dict[str, list[int]]) -> Path:
    """A safetensors file with zero tensors of these shapes (bf16)."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0" * offset)
    return path


def _file(tmp_path: Path, name: str) -> str:
    return str(_safetensors(tmp_path / name, {"diffusion_model.blocks.0.self_attn.q.lora_down.weight": [4, 8]}))


def _peft(tmp_path: Path, name: str = "style", prefix: str = "base_model.model.blocks.0.attn2.to_q") -> str:
    folder = tmp_path / name
    _safetensors(folder / "adapter_model.safetensors", {f"{prefix}.lora_A.weight": [8, 64],
                                                        f"{prefix}.lora_B.weight": [64, 8]})
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 8, "peft_type": "LORA"}))
    return str(folder)


# ----------------------------------------------------------------------------- the request form
def test_per_request_lora_is_one_json_object_with_name_path_and_scale():
    form = VideoRequest("a cat", lora=RequestLora("style", "/srv/loras/style", 2.5)).form_fields()
    assert json.loads(form["lora"]) == {"name": "style", "path": "/srv/loras/style", "scale": 2.5}


def test_euler_goes_out_as_extra_params_sample_solver_and_unipc_sends_nothing():
    assert json.loads(VideoRequest("a", sampler="euler").form_fields()["extra_params"]) == {"sample_solver": "euler"}
    for sampler in (None, "unipc"):
        assert "extra_params" not in VideoRequest("a", sampler=sampler).form_fields()


def test_sampler_merges_with_raw_extra_params_and_refuses_a_contradiction():
    form = VideoRequest("a", sampler="euler", extra={"extra_params": '{"flow_shift": 12}'}).form_fields()
    assert json.loads(form["extra_params"]) == {"flow_shift": 12, "sample_solver": "euler"}
    with pytest.raises(LauncherError) as err:
        VideoRequest("a", sampler="euler", extra={"extra_params": '{"sample_solver": "unipc"}'}).form_fields()
    assert err.value.setting == "sampler"
    with pytest.raises(LauncherError) as err:
        VideoRequest("a", sampler="dpm").form_fields()
    assert err.value.setting == "sampler"


def test_frame_interpolation_fields_and_the_output_bounds_allow_exactly_its_multiplication():
    req = VideoRequest("a", width=64, height=64, num_frames=9, interpolation=FrameInterpolation("/m/rife", exp=2))
    form = req.form_fields()
    assert (form["enable_frame_interpolation"], form["frame_interpolation_exp"], form["frame_interpolation_scale"],
            form["frame_interpolation_model_path"]) == ("true", "2", "1.0", "/m/rife")
    bounds = req.bounds()
    bounds.check(64, 64, (9 - 1) * 4 + 1)                 # what RIFE x4 returns
    with pytest.raises(LauncherError):
        bounds.check(64, 64, 9 * 4 + 5)                  # more than x4 allows
    with pytest.raises(LauncherError):
        VideoRequest("a", num_frames=9).bounds().check(64, 64, 33)   # interpolation off: x1 only
    with pytest.raises(LauncherError) as err:
        VideoRequest("a", interpolation=FrameInterpolation("/m", exp=0)).form_fields()
    assert err.value.setting == "interpolation_exp"


# ----------------------------------------------------------------------------- how LoRAs are served
def test_single_file_on_ti2v_is_fused_at_startup(tmp_path):
    f = _file(tmp_path, "a.safetensors")
    plan = plan_loras([LoraEntry(f, 1.0, "high_noise")], TI2V, V30)      # expert ignored for TI2V
    assert plan.startup.lora_paths == (f,) and plan.per_request is None
    assert plan.startup.flags() == ["--lora-backend", "distill", "--lora-path", f]


def test_a14b_pair_is_fused_high_noise_first_whatever_the_chain_order(tmp_path):
    hi, lo = _file(tmp_path, "hi.safetensors"), _file(tmp_path, "lo.safetensors")
    plan = plan_loras([LoraEntry(lo, 1.0, "low_noise"), LoraEntry(hi, 1.0, "high_noise")], A14B, V30)
    assert plan.startup.lora_paths == (hi, lo)
    assert plan_loras([LoraEntry(hi, 1.0, "both")], A14B, V30).startup.lora_paths == (hi, hi)


@pytest.mark.parametrize("entries,setting", [
    ([("hi", "high_noise")], "expert"),                              # low-noise expert missing
    ([("hi", "high_noise"), ("lo", "high_noise")], "expert"),        # two for one expert
    ([("hi", "both"), ("lo", "low_noise")], "expert"),
])
def test_a14b_fused_sets_upstream_cannot_express_are_refused(tmp_path, entries, setting):
    with pytest.raises(LauncherError) as err:
        plan_loras([LoraEntry(_file(tmp_path, f"{n}.safetensors"), 1.0, e) for n, e in entries], A14B, V30)
    assert err.value.setting == setting


def test_a_strength_a_file_cannot_be_scaled_to_and_0_26_single_files_are_refused_with_the_fix(tmp_path):
    f = _file(tmp_path, "a.safetensors")          # only a down matrix: nothing to scale (test_lora_strength.py)
    with pytest.raises(LauncherError) as err:
        plan_loras([LoraEntry(f, 2.0)], TI2V, V30, data_dir=str(tmp_path / "data"))
    assert err.value.setting == "strength" and "PEFT folder" in err.value.fix
    with pytest.raises(LauncherError) as err:
        plan_loras([LoraEntry(f, 1.0)], TI2V, V26)
    assert "0.30" in err.value.fix and "PEFT" in err.value.fix


def test_peft_folder_goes_per_request_at_any_strength_on_both_versions(tmp_path):
    folder = _peft(tmp_path)
    for version in (V26, V30):
        plan = plan_loras([LoraEntry(folder, 3.0, "both", "style/")], A14B, version)
        assert plan.startup == StartupLora() and plan.per_request == RequestLora("style/", folder, 3.0)
        assert "per request" in plan.notes[0]


def test_peft_limits_mixing_and_strength_range_are_refused(tmp_path):
    a, b, f = _peft(tmp_path, "a"), _peft(tmp_path, "b"), _file(tmp_path, "f.safetensors")
    cases = [([LoraEntry(a), LoraEntry(b)], A14B, "lora_name"),               # one adapter per request
             ([LoraEntry(a, 1.0, "high_noise")], A14B, "expert"),             # binds both experts
             ([LoraEntry(a), LoraEntry(f)], A14B, "lora_name"),               # fused + per request
             ([LoraEntry(a, 0.0)], TI2V, "strength"), ([LoraEntry(a, 11.0)], TI2V, "strength")]
    for entries, family, setting in cases:
        with pytest.raises(LauncherError) as err:
            plan_loras(entries, family, V30)
        assert err.value.setting == setting
    assert plan_loras([LoraEntry(a, 1.0, "high_noise")], TI2V, V30).per_request is not None   # TI2V: ignored


# ----------------------------------------------------------------------------- spec and CLI
def test_startup_loras_are_in_the_spec_fingerprint_and_a_spec_without_keeps_its_old_one(tmp_path):
    base = LaunchSpec("Wan-AI/Wan2.2-TI2V-5B-Diffusers")
    assert "lora" not in base.to_dict()                      # fingerprints from before LoRAs still match
    fused = base.with_changes(lora=StartupLora((_file(tmp_path, "a.safetensors"),)))
    other = base.with_changes(lora=StartupLora((_file(tmp_path, "b.safetensors"),)))
    assert len({base.fingerprint(), fused.fingerprint(), other.fingerprint()}) == 3
    assert LaunchSpec.from_dict(fused.to_dict()) == fused
    assert fused.flags()[-4:-1] == ["--lora-backend", "distill", "--lora-path"]
    with pytest.raises(SpecError):
        fused.validate(version=V26)
    with pytest.raises(SpecError):
        LaunchSpec("Wan-AI/Wan2.2-T2V-A14B-Diffusers", lora=StartupLora(("/x.safetensors",))).validate()


def test_cli_lora_syntax_strength_and_a14b_expert_order(tmp_path):
    hi, lo = _file(tmp_path, "hi.safetensors"), _file(tmp_path, "lo.safetensors")
    entries = parse_cli_loras([hi, f"{lo}:1.5"], [], A14B)
    assert [(e.path, e.strength, e.expert) for e in entries] == [(hi, 1.0, "high_noise"), (lo, 1.5, "low_noise")]
    swapped = parse_cli_loras([lo, hi], ["low_noise", "high_noise"], A14B)
    assert [e.expert for e in swapped] == ["low_noise", "high_noise"]
    assert parse_cli_loras([hi], [], A14B)[0].expert == "both"
    assert startup_from_cli([lo, hi], ["low_noise", "high_noise"], A14B.hf_id).lora_paths == (hi, lo)
    with pytest.raises(LauncherError) as err:
        parse_cli_loras([hi, lo], ["low_noise"], A14B)
    assert err.value.setting == "lora_expert"
    with pytest.raises(LauncherError) as err:
        startup_from_cli([_peft(tmp_path)], [], TI2V.hf_id)
    assert "--lora-request" in err.value.fix
    with pytest.raises(LauncherError) as err:
        parse_cli_loras([str(tmp_path / "missing.safetensors")], [], TI2V)
    assert "does not exist" in err.value.what


# ----------------------------------------------------------------------------- finding and choosing LoRAs
def test_find_loras_lists_files_by_relative_name_and_peft_folders_with_a_slash(tmp_path):
    _file(tmp_path / "wan", "light_high.safetensors")
    _file(tmp_path, "top.safetensors")
    _peft(tmp_path / "peft", "style")
    (tmp_path / "notes.txt").write_text("x")
    found = find_loras([tmp_path, tmp_path / "missing"])
    assert sorted(found) == ["peft/style/", "top.safetensors", "wan/light_high.safetensors"]
    assert found["peft/style/"] == tmp_path / "peft" / "style"


def test_lora_node_takes_only_list_entries_and_chains(tmp_path, monkeypatch):
    _file(tmp_path, "hi.safetensors")
    _file(tmp_path, "lo.safetensors")
    monkeypatch.setattr(model_nodes.comfy_bridge, "lora_folders", lambda: [tmp_path])
    lora_name = next(i for i in NODES["VLLMOmniLora"].inputs() if i.name == "lora_name")
    assert lora_name.choices() == ["hi.safetensors", "lo.safetensors"]
    model = ModelChoice(A14B.hf_id, A14B.key, A14B.hf_id)
    (one,) = run_node("VLLMOmniLora", model, "hi.safetensors", 1.0, "high_noise")
    (two,) = run_node("VLLMOmniLora", one, "lo.safetensors", 1.0, "low_noise")
    assert [(e.label, e.expert) for e in two.loras] == [("hi.safetensors", "high_noise"), ("lo.safetensors", "low_noise")]
    assert model.loras == ()                                 # the input handle is not changed
    for name in ("/etc/passwd", "../hi.safetensors", str(tmp_path / "hi.safetensors")):
        with pytest.raises(LauncherError) as err:
            run_node("VLLMOmniLora", model, name, 1.0, "both")
        assert err.value.setting == "lora_name" and "not one of" in err.value.what


# ----------------------------------------------------------------------------- planner and Doctor
def test_memory_plan_counts_fused_load_peak_and_the_per_request_adapter(tmp_path):
    spec = LaunchSpec(A14B.hf_id)
    base = memory_plan(spec, None, [141], host_available_gib=None)
    fused = memory_plan(spec.with_changes(lora=StartupLora(("/h", "/l"))), None, [141], host_available_gib=None)
    assert "load" in fused.gpus[0].phases and "load" not in base.gpus[0].phases
    assert fused.gpus[0].phases["load"] > base.gpus[0].phases["resident"]
    assert fused.peak_gib == pytest.approx(base.peak_gib)           # nothing extra after loading
    adapter = memory_plan(spec, None, [141], host_available_gib=None, lora_adapter_gib=0.5)
    assert adapter.peak_gib == pytest.approx(base.peak_gib + 0.5)


def test_adapter_gpu_size_counts_every_expert_it_binds(tmp_path):
    relative = RequestLora("a", _peft(tmp_path, "a"))
    scoped = RequestLora("b", _peft(tmp_path, "b", prefix="base_model.model.transformer_2.blocks.0.attn2.to_q"))
    one = 2 * 8 * 64 * 2 / 2**30                                     # A and B, bf16
    assert adapter_gpu_gib(relative, A14B) == pytest.approx(2 * one)
    assert adapter_gpu_gib(relative, TI2V) == pytest.approx(one)
    assert adapter_gpu_gib(scoped, A14B) == pytest.approx(one)


def test_doctor_lists_loras_and_whether_the_server_version_can_serve_each(tmp_path):
    _file(tmp_path, "light.safetensors")
    _peft(tmp_path, "style")
    old = _check_loras([tmp_path], V26)
    assert old.status == "warning" and "light.safetensors: single file" in old.summary and "0.30" in old.fix
    assert "style/: PEFT folder: applied per request" in old.summary
    assert _check_loras([tmp_path], V30).status == "ok"
    assert _check_loras([tmp_path], None).status == "unchecked"
