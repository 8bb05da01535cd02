"""The repository stands alone: no source, script or doc cites notes that live outside it.

Facts the code relies on are written in its own comments or in docs/upstream-facts.md; a
citation of a file that a reader of this repository cannot open is a dangling reference.
The file set is what git tracks plus new files not yet added (minus ignored ones such as
the virtual environments), so a fresh file is caught before it is committed.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Built by concatenation so that this file does not cite them itself.
FORBIDDEN = (
    "vllm-omni-serving" + ".md",
    "comfyui-nodes" + ".md",
    "landscape" + ".md",
    "shared/" + "gpu-kit",
    "../" + "shared",
)
SUFFIXES = (".py", ".sh", ".md")


def _repo_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO, capture_output=True, check=True, timeout=60,
    ).stdout.decode("utf-8", "surrogateescape")
    return [REPO / name for name in out.split("\0") if name.endswith(SUFFIXES)]


def test_file_list_covers_the_package_sources():
    names = {p.relative_to(REPO).as_posix() for p in _repo_files()}
    assert "errors/__init__.py" in names and "planner/memory.py" in names and "README.md" in names


def test_no_file_cites_notes_outside_the_repository():
    hits = []
    for path in _repo_files():
        if not path.is_file():      # deleted in the work tree but still in the index
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for needle in FORBIDDEN:
                if needle in line:
                    hits.append(f"{path.relative_to(REPO)}:{number}: {needle}")
    assert not hits, "cite docs/upstream-facts.md instead:\n" + "\n".join(hits)
