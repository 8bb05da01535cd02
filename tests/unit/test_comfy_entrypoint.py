"""The package's ComfyUI entry: a ComfyUI too old for the pinned V3 API gets one log line naming the
ComfyUI the pack needs and no node at all (no half-registration, no traceback); a current one finds
no V1 NODE_CLASS_MAPPINGS and takes `comfy_entrypoint`. ComfyUI is a stand-in here (its
comfyui_version module and the pinned comfy_api module); tests/comfyui runs the real one."""
from __future__ import annotations

import logging
import sys
import tomllib
import types
from pathlib import Path

import pytest

import vllm_omni_launcher as pkg
from vllm_omni_launcher.nodes import v3
from vllm_omni_launcher.nodes.comfy_bridge import PINNED


@pytest.fixture
def comfyui(monkeypatch):
    """Install a stand-in ComfyUI of a version, with or without the pinned V3 module."""
    def install(version: str, pinned: bool) -> None:
        monkeypatch.setitem(sys.modules, "comfyui_version", types.SimpleNamespace(__version__=version))
        module = None
        if pinned:
            module = types.SimpleNamespace(io=types.SimpleNamespace(ComfyNode=type("ComfyNode", (), {}),
                                                                    Schema=object), ComfyExtension=object)
        monkeypatch.setitem(sys.modules, PINNED, module)     # None: `import` fails, as in a ComfyUI without it
        pkg._too_old.cache_clear()

    yield install
    pkg._too_old.cache_clear()


@pytest.mark.parametrize("version, pinned", [("0.3.40", False), ("0.3.50", True)])
def test_a_too_old_comfyui_gets_one_line_naming_the_version_needed_and_no_node(comfyui, caplog, version, pinned):
    comfyui(version, pinned)
    with caplog.at_level(logging.WARNING):
        assert hasattr(pkg, "NODE_CLASS_MAPPINGS")          # what ComfyUI asks first ...
        assert pkg.NODE_CLASS_MAPPINGS == {}                 # ... and registers: nothing
    (line,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert f"needs ComfyUI {'.'.join(map(str, v3.NEEDS))} or newer" in line.getMessage()
    assert f"this is ComfyUI {version}" in line.getMessage() and PINNED in line.getMessage()
    assert line.exc_info is None and "\n" not in line.getMessage()
    with pytest.raises(v3.ComfyUITooOld) as err:            # ComfyUI logs this one line if it calls us anyway
        pkg.comfy_entrypoint()
    assert str(err.value) == line.getMessage()


def test_a_current_comfyui_finds_no_v1_mappings_and_takes_the_v3_entry_point(comfyui, caplog):
    comfyui("0.3.64", True)
    with caplog.at_level(logging.WARNING):
        assert not hasattr(pkg, "NODE_CLASS_MAPPINGS")
        assert callable(pkg.comfy_entrypoint)
    assert not caplog.records


def test_the_registry_is_told_the_same_comfyui_the_pack_checks_for():
    pyproject = tomllib.loads((Path(pkg.__file__).parent / "pyproject.toml").read_text())
    assert pyproject["tool"]["comfy"]["requires-comfyui"] == ">=" + ".".join(map(str, v3.NEEDS))
