"""A scaled LoRA copy a server of ours uses is never evicted, and lora_files learns which copies are in
use without reaching up to the registry.

The supervisor restarts a crashed server from its spec, whose --lora-path names the copy; had the
copy been evicted meanwhile (the newest KEEP are kept, and other launches make new ones), the
restart would fail for a missing file. The copies in use are those named by the state files
(running servers of any launcher process on the data dir) and by this process's supervisors
(a server being restarted has no state file until it is back), which the registry hands to
server/launch/lora_files.py (`add_in_use_source`): lora_files imports neither the registry nor the
supervisor, not even lazily inside a function, so registry -> supervisor -> spec -> loras -> lora_files
is one direction."""
from __future__ import annotations

import ast
import json
import os
from pathlib import Path

from vllm_omni_launcher.server import registry
from vllm_omni_launcher.server.storage import state_file
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.launch import lora_files
from vllm_omni_launcher.server.launch.lora_files import KEEP, add_in_use_source, copies_in_use, scaled_lora
from vllm_omni_launcher.server.launch.loras import StartupLora
from vllm_omni_launcher.server.launch.spec import LaunchSpec
from vllm_omni_launcher.server.supervision.supervisor import Supervisor

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
PACKAGE = Path(__file__).resolve().parents[2]


def _lora(path: Path) -> Path:
    """A one-tensor safetensors LoRA (an F32 up weight, so it can be scaled)."""
    header = json.dumps({"blocks.0.attn.lora_up.weight": {"dtype": "F32", "shape": [2, 2],
                                                           "data_offsets": [0, 16]}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(16))
    return path


def _copies(src: Path, data: str, strengths: list[float], first_mtime: int) -> list[Path]:
    made = []
    for i, strength in enumerate(strengths):
        made.append(scaled_lora(src, strength, data))
        os.utime(made[-1], ns=(first_mtime + i * 10**9,) * 2)          # distinct mtimes, oldest first
    return made


def _spec(copy: Path) -> LaunchSpec:
    return LaunchSpec(model=TI2V, gpus=(0,), lora=StartupLora((str(copy),)))


def _state(spec: LaunchSpec, pgid: int) -> state_file.ServerState:
    return state_file.ServerState(pgid=pgid, leader_create_time=None, server_pid=None, server_create_time=None,
                                  argv=["vllm", "serve", TI2V], host="127.0.0.1", port=8091,
                                  fingerprint=spec.fingerprint(), requested_fingerprint=spec.fingerprint(),
                                  spec=spec.to_dict())


def test_a_copy_named_by_a_running_servers_state_file_outlives_newer_copies(tmp_path):
    src, data = _lora(tmp_path / "a.safetensors"), str(tmp_path / "data")
    (used,) = _copies(src, data, [0.5], 10**18)
    state_file.write(data, _state(_spec(used), pgid=4242))
    assert copies_in_use(data) == {used.resolve()}
    newer = _copies(src, data, [1.5 + i for i in range(KEEP + 2)], 10**18 + 10**10)
    left = sorted(p.name for p in (tmp_path / "data" / "loras").glob("*.safetensors"))
    # the copy in use counts towards KEEP: it and the newest KEEP - 1 are left
    assert left == sorted([used.name] + [p.name for p in newer[-(KEEP - 1):]])

    state_file.remove(data, 4242)                    # that server stopped: its copy is an old one now
    _copies(src, data, [20.0], 10**18 + 10**11)
    assert not used.exists()


def test_a_copy_of_a_supervisor_in_this_process_survives_while_it_has_no_state_file(tmp_path):
    src, data = _lora(tmp_path / "a.safetensors"), str(tmp_path / "data")
    (used,) = _copies(src, data, [0.5], 10**18)
    sup = Supervisor(_spec(used), LocalConfig(data_dir=data))   # never started: a restart in progress
    registry._register(sup)
    try:
        assert not state_file.read_all(data)
        _copies(src, data, [1.5 + i for i in range(KEEP + 2)], 10**18 + 10**10)
        assert used.exists()
    finally:
        registry._unregister(sup)
    _copies(src, data, [20.0], 10**18 + 10**11)
    assert not used.exists()


def test_a_state_file_we_did_not_write_protects_nothing(tmp_path):
    src, data = _lora(tmp_path / "a.safetensors"), str(tmp_path / "data")
    (used,) = _copies(src, data, [0.5], 10**18)
    path = state_file.write(data, _state(_spec(used), pgid=4343))
    os.chmod(path, 0o644)                             # not private: state_file.read ignores it
    assert copies_in_use(data) == set()
    _copies(src, data, [1.5 + i for i in range(KEEP + 2)], 10**18 + 10**10)
    assert not used.exists()


# ---- who tells lora_files which copies are in use ------------------------------------------------------
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
    names = _imported_anywhere(PACKAGE / "server" / "launch" / "lora_files.py")
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
