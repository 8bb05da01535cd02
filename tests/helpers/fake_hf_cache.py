"""A Hugging Face hub cache laid out as huggingface_hub 1.x writes one (file_download.py): the file's bytes in
`blobs/<etag>`, the snapshot's entry a relative link to it, `refs/main` naming the snapshot (no newline)."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_file(hub: Path, repo: str, filename: str, data: bytes, revision: str = "a" * 40) -> Path:
    """Put `filename` of `repo` into the cache at `hub`; returns the snapshot's path of it."""
    root = hub / ("models--" + repo.replace("/", "--"))
    blob = root / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    entry = root / "snapshots" / revision / filename
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.symlink_to(os.path.relpath(blob, entry.parent))
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(revision)
    return entry
