"""The pack inside a real ComfyUI (tests/comfyui/run_real_comfyui.py), as pytest tests.

These run only when COMFYUI_DIR names a ComfyUI checkout (CI has none; they are skipped
with that reason). ComfyUI runs under COMFYUI_PYTHON (default: this python), which needs
ComfyUI's requirements and ours; the browser test needs the `playwright` package and a
system Chromium (CHROMIUM or chromium on PATH). The stub server python comes from
VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON, as for the other stub tests.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

COMFYUI_DIR = os.environ.get("COMFYUI_DIR", "").strip()
if not COMFYUI_DIR:
    pytest.skip("COMFYUI_DIR is not set: the real-ComfyUI tests need a ComfyUI checkout "
                "(e.g. COMFYUI_DIR=/path/to/ComfyUI; see tests/comfyui/run_real_comfyui.py)",
                allow_module_level=True)

import run_real_comfyui as real  # noqa: E402
from comfy_harness import ComfyUI  # noqa: E402


@pytest.fixture(scope="module")
def comfy() -> Iterator[ComfyUI]:
    work = Path(tempfile.mkdtemp(prefix="vllm-omni-comfyui-test-"))
    server = ComfyUI(Path(COMFYUI_DIR), os.environ.get("COMFYUI_PYTHON", sys.executable), real.launcher_env(work))
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
        server.cleanup()


def test_comfyui_registers_our_8_nodes_without_import_failure(comfy):
    report = real.check_registration(comfy)
    assert len(report["nodes"]) == 8


def test_ti2v_text_to_video_template_makes_a_video_in_comfyuis_output_folder(comfy):
    report = real.check_generate(comfy)
    assert report["frames"] == real.TINY["frames"] and report["bytes"] > 0


def test_every_template_loads_in_the_browser_without_missing_nodes_or_errors(comfy, tmp_path):
    report = real.check_templates_in_browser(comfy, tmp_path / "screenshots")
    assert report["template_browser"]["cards"] == sorted(real.EXPECTED_TEMPLATES)
