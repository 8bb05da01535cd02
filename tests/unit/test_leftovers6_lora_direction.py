"""Issue 17 leftover (session 6): server/lora_files.py no longer reaches up to the registry (not even
lazily inside a function): the registry hands it this process's supervisors' LoRA paths instead
(`add_in_use_source`), so registry -> supervisor -> spec -> loras -> lora_files is one direction.
That the copies in use are still kept is tests/unit/test_followups_lora_in_use.py's."""
from __future__ import annotations

import ast
from pathlib import Path

from test_followups_lora_in_use import _copies, _lora
from test_import_graph import ROOT
from vllm_omni_launcher.server import lora_files, registry
from vllm_omni_launcher.server.lora_files import add_in_use_source, copies_in_use


def _imported_anywhere(path: Path) -> set[str]:
    """Every module name an import statement in `path` names, at any depth (function bodies included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names.add(node.module or "")
            names.update(f"{node.module or ''}.{a.name}".lstrip(".") for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_lora_files_imports_no_registry_nor_supervisor_anywhere():
    names = _imported_anywhere(ROOT / "server" / "lora_files.py")
    assert not [n for n in names if n.split(".")[-1] in ("registry", "supervisor", "adoption")], names


def test_the_registry_hands_its_supervisors_to_lora_files():
    assert registry._lora_paths_in_use in lora_files._in_use_sources      # noqa: SLF001 - registered on import


def test_a_registered_source_keeps_the_copies_it_names(tmp_path, monkeypatch):
    monkeypatch.setattr(lora_files, "_in_use_sources", [])
    src, data = _lora(tmp_path / "a.safetensors"), str(tmp_path / "data")
    (used,) = _copies(src, data, [0.5], 10**18)
    named = [str(used)]
    add_in_use_source(lambda: named)
    add_in_use_source(lora_files._in_use_sources[0])                       # noqa: SLF001 - once only
    assert len(lora_files._in_use_sources) == 1                           # noqa: SLF001
    assert copies_in_use(data) == {used.resolve()}
    _copies(src, data, [1.5 + i for i in range(lora_files.KEEP + 2)], 10**18 + 10**10)
    assert used.exists()
    named.clear()                                                          # that server is gone
    _copies(src, data, [20.0], 10**18 + 10**11)
    assert not used.exists()
