"""`python -m bench.gpu report` pairs ours / native only within one machine: every report records who ran it
(bench.gpu.common.machine: the kernel's boot id and the GPUs' UUIDs), and a folder whose reports name two
machines is refused with the files of each, since device machines of one kind report the same GPU name,
memory and driver."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu import common
from bench.gpu.report import combined

GPU = "NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04"


def _report(folder: Path, name: str, side: str, machine: dict) -> None:
    run = {"side": side, "run": "default-20", "pair": "default warm 20 steps", "steps": 20, "status": "success",
           "end_to_end_s": 100.0 if side == "ours" else 120.0, "node_s": {}}
    (folder / name).mkdir(parents=True)
    (folder / name / "report.json").write_text(json.dumps(
        {"machine": dict(machine, gpu=GPU), "args": {"family": "t2v-a14b", "sides": side}, "runs": [run]}))


def test_reports_of_one_machine_are_paired(tmp_path: Path) -> None:
    who = {"boot_id": "b-1", "gpu_uuids": "GPU-aaa"}
    _report(tmp_path, "native-default", "native", who)
    _report(tmp_path, "ours-default", "ours", who)
    paired, sources = combined(tmp_path)
    assert [r["side"] for r in paired["runs"]] == ["native", "ours"]
    assert not any("identity not recorded" in s for s in sources)


def test_reports_of_two_machines_are_refused_naming_each_machines_files(tmp_path: Path) -> None:
    _report(tmp_path, "native-default", "native", {"boot_id": "b-1", "gpu_uuids": "GPU-aaa"})
    _report(tmp_path, "ours-default", "ours", {"boot_id": "b-2", "gpu_uuids": "GPU-bbb"})
    with pytest.raises(SystemExit) as err:
        combined(tmp_path)
    text = str(err.value)
    assert "do not all come from one machine" in text
    assert "native-default/report.json (b-1 GPU-aaa)" in text and "ours-default/report.json (b-2 GPU-bbb)" in text
    assert "folder of their own" in text


def test_a_report_without_identity_beside_one_with_is_refused(tmp_path: Path) -> None:
    _report(tmp_path, "native-default", "native", {"boot_id": "b-1", "gpu_uuids": "GPU-aaa"})
    _report(tmp_path, "ours-default", "ours", {})
    with pytest.raises(SystemExit, match="no machine identity recorded"):
        combined(tmp_path)


def test_older_reports_without_identity_are_paired_with_a_note(tmp_path: Path) -> None:
    _report(tmp_path, "native-default", "native", {})
    _report(tmp_path, "ours-default", "ours", {})
    paired, sources = combined(tmp_path)
    assert len(paired["runs"]) == 2
    assert any("machine identity not recorded" in s for s in sources)


def test_machine_records_this_boots_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    boot = tmp_path / "boot_id"
    boot.write_text("0f2c-boot\n")
    monkeypatch.setattr(common, "BOOT_ID", boot)
    monkeypatch.setattr("shutil.which", lambda name: None)     # no nvidia-smi on this machine
    assert common.machine()["boot_id"] == "0f2c-boot"
