"""`doctor --loras DIR` (issue 13): every LoRA file and PEFT folder in the folders given, and whether
the server environment's vLLM-Omni serves it fused at startup, per request, or not (and why); the
same check the Doctor node runs on ComfyUI's loras folders. The server environment is faked (its
version is what matters); the folders and files are real."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from vllm_omni_launcher.cli import main
from vllm_omni_launcher.cli.exit_codes import ExitCode
from vllm_omni_launcher.planner import doctor as doctor_mod

UP = {"diffusion_model.blocks.0.self_attn.q.lora_up.weight": {"dtype": "BF16", "shape": [2, 1], "data_offsets": [0, 4]},
      "diffusion_model.blocks.0.self_attn.q.lora_down.weight": {"dtype": "BF16", "shape": [1, 2],
                                                                "data_offsets": [4, 8]}}


def _file(path: Path, header: dict) -> None:
    blob = json.dumps(header).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    size = max((v["data_offsets"][1] for v in header.values()), default=0)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0" * size)


@pytest.fixture
def loras(tmp_path: Path) -> tuple[Path, Path]:
    first, second = tmp_path / "loras", tmp_path / "more"
    _file(first / "wan" / "light_high.safetensors", UP)
    _file(first / "fp8.safetensors", {k: {**v, "dtype": "F8_E4M3"} for k, v in UP.items()})
    (first / "broken.safetensors").write_bytes(b"\xff" * 16)
    style = second / "style"
    _file(style / "adapter_model.safetensors", UP)
    (style / "adapter_config.json").write_text('{"r": 1, "lora_alpha": 1, "peft_type": "LORA"}')
    return first, second


def _doctor(monkeypatch, capsys, version: str, *folders: Path) -> dict:
    monkeypatch.setattr(doctor_mod, "check_server_env", lambda *a, **k: ([], {"vllm-omni": version}))
    args = ["doctor", "--port", "1", "--json"] + [x for f in folders for x in ("--loras", str(f))]
    assert main(args) in (ExitCode.OK, ExitCode.PROBLEMS_FOUND)
    report = json.loads(capsys.readouterr().out)
    return next(c for c in report["checks"] if c["name"] == "loras")


def test_doctor_lists_each_lora_of_every_folder_and_how_0_30_serves_it(loras, monkeypatch, capsys):
    check = _doctor(monkeypatch, capsys, "0.30.0", *loras)
    rows = {r["name"]: r for r in check["details"]["loras"]}
    assert sorted(rows) == ["broken.safetensors", "fp8.safetensors", "style/", "wan/light_high.safetensors"]
    assert rows["wan/light_high.safetensors"]["servable"]
    assert "fused at startup (any strength" in rows["wan/light_high.safetensors"]["how"]
    assert rows["style/"]["how"].startswith("PEFT folder: applied per request")
    assert rows["fp8.safetensors"]["servable"] and "strength 1.0 only" in rows["fp8.safetensors"]["how"]
    assert not rows["broken.safetensors"]["servable"] and "not a safetensors file" in rows["broken.safetensors"]["how"]
    assert check["status"] == "warning" and "replace" in check["fix"]
    assert "\n  wan/light_high.safetensors: single file: fused at startup" in check["summary"]


def test_doctor_on_0_26_says_single_files_cannot_be_served_and_why(loras, monkeypatch, capsys):
    check = _doctor(monkeypatch, capsys, "0.26.0", loras[0])
    rows = {r["name"]: r for r in check["details"]["loras"]}
    assert not rows["wan/light_high.safetensors"]["servable"]
    assert "new in 0.30" in rows["wan/light_high.safetensors"]["how"] and "0.30" in check["fix"]


def test_doctor_names_a_lora_folder_that_is_not_there(tmp_path, monkeypatch, capsys):
    check = _doctor(monkeypatch, capsys, "0.30.0", tmp_path / "nope")
    assert check["status"] == "warning" and "not a folder" in check["summary"]


def test_doctor_text_shows_one_line_per_lora(loras, monkeypatch, capsys):
    monkeypatch.setattr(doctor_mod, "check_server_env", lambda *a, **k: ([], {"vllm-omni": "0.30.0"}))
    main(["doctor", "--port", "1", "--loras", str(loras[1])])
    out = capsys.readouterr().out
    assert "loras: 1 LoRA(s), vLLM-Omni 0.30:\n  style/: PEFT folder: applied per request" in out
