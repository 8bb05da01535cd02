"""The record `prestart_last_server` starts from (server/storage/last_server.py, nodes/prestart.py):
written private and secret-free, read back to the same choices, and any record the launcher did
not write or cannot use starts nothing and says why in one line."""
from __future__ import annotations

import json
import os
import stat

import pytest

from vllm_omni_launcher.nodes import last_choices, prestart
from vllm_omni_launcher.nodes.handles import ModelChoice, ServingChoice
from vllm_omni_launcher.server import registry
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.launch.loras import LoraEntry
from vllm_omni_launcher.server.storage import last_server

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"


def _config(tmp_path, on: bool = True) -> LocalConfig:
    return LocalConfig(data_dir=str(tmp_path), prestart_last_server=on)


def _record(tmp_path, model: ModelChoice, serving: ServingChoice = ServingChoice()) -> dict:
    last_choices.record(model, serving, False, 3, "f" * 64, _config(tmp_path))
    return json.loads(last_server.record_path(str(tmp_path)).read_text())


def test_record_is_private_and_its_choices_round_trip(tmp_path):
    lora = tmp_path / "style.safetensors"
    lora.write_bytes(b"x")
    model = ModelChoice(TI2V, "ti2v_5b", "TI2V-5B", (LoraEntry(str(lora), 0.75, "both", "style"),))
    serving = ServingChoice(gpus="0", parallel_mode="none", keep_alive_minutes=5, compile=False)
    _record(tmp_path, model, serving)
    path = last_server.record_path(str(tmp_path))
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    entry = last_server.read(str(tmp_path))
    assert (entry["cfg"], entry["queued_jobs"], entry["fingerprint"]) == (False, 3, "f" * 64)
    assert last_choices.choices(entry) == (model, serving)


def test_an_a14b_lora_pair_one_per_expert_round_trips(tmp_path):
    """The 4-step LoRA template's chain: one file per expert, as the LoRA node's `expert` names them."""
    high, low = tmp_path / "high.safetensors", tmp_path / "low.safetensors"
    high.write_bytes(b"x")
    low.write_bytes(b"x")
    model = ModelChoice("Wan-AI/Wan2.2-T2V-A14B-Diffusers", "t2v_a14b", "T2V-A14B",
                        (LoraEntry(str(high), 1.0, "high_noise", "high"), LoraEntry(str(low), 1.0, "low_noise", "low")))
    _record(tmp_path, model)
    assert last_choices.choices(last_server.read(str(tmp_path)))[0] == model


def test_record_holds_no_secret_field():
    """ModelChoice, LoraEntry and ServingChoice are what the record stores: none has a key or token."""
    import dataclasses

    names = {f.name for cls in (ModelChoice, LoraEntry, ServingChoice) for f in dataclasses.fields(cls)}
    names.discard("family_key")          # the model family's id ("ti2v_5b"), not a credential
    assert not {n for n in names if any(word in n for word in ("key", "token", "secret", "password"))}


def test_setting_off_starts_nothing(tmp_path):
    _record(tmp_path, ModelChoice(TI2V, "ti2v_5b"))
    assert prestart.maybe_start(_config(tmp_path, on=False)) is None
    assert not registry.all_servers()


def test_no_record_starts_nothing_and_says_nothing(tmp_path, capsys):
    assert prestart.maybe_start(_config(tmp_path)) is None
    assert capsys.readouterr().out == ""


def _hostile_cases(tmp_path):
    """Each case breaks the record in one way (the file the launcher wrote, changed)."""
    def edit(change):
        def apply(path):
            data = json.loads(path.read_text())
            change(data)
            path.write_text(json.dumps(data))
        return apply

    def symlink(path):
        target = tmp_path / "elsewhere.json"
        os.replace(path, target)
        os.symlink(target, path)

    def missing_folder(data):
        data["model"]["model"] = str(tmp_path / "gone")

    return {
        "symlink": symlink,
        "oversize": lambda path: path.write_bytes(b" " * (last_server.MAX_BYTES + 1)),
        "not json": lambda path: path.write_text("{"),
        "nan": lambda path: path.write_text(path.read_text().replace('"queued_jobs": 3', '"queued_jobs": NaN')),
        "infinite strength": lambda path: path.write_text(path.read_text().replace('"strength": 1.0', '"strength": 1e999')),
        "strength over the LoRA node's maximum": edit(lambda d: d["model"]["loras"][0].update(strength=11.0)),
        "wrong type": edit(lambda d: d.update(cfg="yes")),
        "bool as count": edit(lambda d: d.update(queued_jobs=True)),
        "unknown family": edit(lambda d: d["model"].update(family_key="wan9")),
        "missing model folder": edit(missing_folder),
        "missing lora": edit(lambda d: d["model"]["loras"][0].update(path=str(tmp_path / "gone.safetensors"))),
        "serving out of range": edit(lambda d: d["serving"].update(keep_alive_minutes=99999)),
        "serving unknown option": edit(lambda d: d["serving"].update(parallel_mode="warp")),
        "serving extra widget": edit(lambda d: d["serving"].update(api_key="x")),
        "open to others": lambda path: os.chmod(path, 0o644),
    }


HOSTILE = ["symlink", "oversize", "not json", "nan", "infinite strength", "strength over the LoRA node's maximum",
           "wrong type", "bool as count",
           "unknown family", "missing model folder", "missing lora", "serving out of range", "serving unknown option",
           "serving extra widget", "open to others"]


@pytest.mark.parametrize("case", HOSTILE)
def test_broken_or_hostile_record_starts_nothing_and_says_why_in_one_line(tmp_path, capsys, case):
    folder = tmp_path / "model"
    folder.mkdir()
    lora = tmp_path / "style.safetensors"
    lora.write_bytes(b"x")
    _record(tmp_path, ModelChoice(str(folder), "ti2v_5b", "", (LoraEntry(str(lora)),)))
    _hostile_cases(tmp_path)[case](last_server.record_path(str(tmp_path)))
    assert prestart.maybe_start(_config(tmp_path)) is None
    assert not registry.all_servers()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and last_server.SETTING in lines[0] and last_server.FILE_NAME in lines[0], lines


def test_parse_refuses_a_record_of_another_version():
    with pytest.raises(last_server.BadRecord, match="version"):
        last_server.parse(json.dumps({"version": 99}).encode())
