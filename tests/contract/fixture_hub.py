"""The Hugging Face Hub seam of upstream.py (its point 1): a local, read-only Hub for the stub server and
the resolver, under the server python.

``install_fixture_hub`` gives ``huggingface_hub.set_client_factory`` (the library's own hook for custom
HTTP clients) an ``httpx`` client whose transport is :class:`FixtureHub`: it serves the JSON files under
``fixtures/hf/<org>/<repo>/`` with the Hub's API shapes and answers every other repository with the
Hub's 401 ``X-Error-Code: RepoNotFound``. Everything above the transport is upstream's own code.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FIXTURE_HUB_DIR = HERE / "fixtures" / "hf"

# The Wan2.2 Diffusers repositories the fixture Hub knows (org/name -> folder).
FIXTURE_REPOS: dict[str, Path] = {
    f"{org.name}/{repo.name}": repo
    for org in sorted(FIXTURE_HUB_DIR.iterdir()) if org.is_dir()
    for repo in sorted(org.iterdir()) if repo.is_dir()
} if FIXTURE_HUB_DIR.is_dir() else {}


class FixtureHub:
    """``httpx`` transport answering the Hub API from ``fixtures/hf`` (read-only)."""

    def __init__(self, repos: dict[str, Path] | None = None) -> None:
        self.repos = FIXTURE_REPOS if repos is None else repos
        self._files: dict[str, dict[str, bytes]] = {}
        self._sha: dict[str, str] = {}

    def _repo(self, repo_id: str) -> tuple[dict[str, bytes], str] | None:
        if repo_id not in self.repos:
            return None
        if repo_id not in self._files:
            root = self.repos[repo_id]
            files = {
                p.relative_to(root).as_posix(): p.read_bytes()
                for p in sorted(root.rglob("*")) if p.is_file()
            }
            digest = hashlib.sha1()
            for name, data in files.items():
                digest.update(name.encode() + b"\0" + data + b"\0")
            self._files[repo_id], self._sha[repo_id] = files, digest.hexdigest()
        return self._files[repo_id], self._sha[repo_id]

    @staticmethod
    def _json(request, payload: Any, status: int = 200, headers: dict | None = None):
        import httpx

        body = json.dumps(payload).encode()
        hdrs = {"Content-Type": "application/json; charset=utf-8", "Content-Length": str(len(body))}
        hdrs.update(headers or {})
        return httpx.Response(status, headers=hdrs, content=b"" if request.method == "HEAD" else body,
                              request=request)

    def _not_found(self, request, code: str, message: str, status: int = 404):
        return self._json(request, {"error": message}, status,
                          {"X-Error-Code": code, "X-Error-Message": message})

    def handle_request(self, request):  # httpx.BaseTransport interface
        import httpx
        from urllib.parse import unquote

        parts = [unquote(p) for p in request.url.path.split("/") if p]
        # /api/models/{org}/{name}[/revision/{rev} | /tree/{rev}[/path...] | /paths-info/{rev}]
        if len(parts) >= 4 and parts[:2] == ["api", "models"]:
            repo_id = f"{parts[2]}/{parts[3]}"
            found = self._repo(repo_id)
            if found is None:
                return self._not_found(request, "RepoNotFound", "Repository not found", 401)
            files, sha = found
            rest = parts[4:]
            if not rest or rest[0] == "revision":
                return self._json(request, {
                    "_id": sha[:24], "id": repo_id, "modelId": repo_id, "sha": sha,
                    "private": False, "gated": False, "disabled": False, "tags": ["diffusers"],
                    "library_name": "diffusers", "lastModified": "2025-08-01T00:00:00.000Z",
                    "siblings": [{"rfilename": name} for name in files],
                })
            if rest[0] == "tree":
                prefix = "/".join(rest[2:])
                recursive = request.url.params.get("recursive") in ("true", "True", "1")
                entries, dirs = [], set()
                for name, data in files.items():
                    if prefix and not name.startswith(prefix.rstrip("/") + "/"):
                        continue
                    rel = name[len(prefix.rstrip("/")) + 1:] if prefix else name
                    if "/" in rel and not recursive:
                        dirs.add((prefix.rstrip("/") + "/" if prefix else "") + rel.split("/")[0])
                        continue
                    entries.append({"type": "file", "oid": hashlib.sha1(data).hexdigest(),
                                    "size": len(data), "path": name})
                if recursive:
                    for name in files:
                        segs = name.split("/")[:-1]
                        for i in range(1, len(segs) + 1):
                            d = "/".join(segs[:i])
                            if not prefix or d.startswith(prefix.rstrip("/") + "/"):
                                dirs.add(d)
                entries += [{"type": "directory", "oid": sha, "size": 0, "path": d} for d in sorted(dirs)]
                return self._json(request, entries)
            if rest[0] == "paths-info":
                from urllib.parse import parse_qs

                wanted = parse_qs(request.content.decode(errors="replace")).get("paths", [])
                return self._json(request, [
                    {"type": "file", "oid": hashlib.sha1(files[p]).hexdigest(), "size": len(files[p]), "path": p}
                    for p in wanted if p in files])
            return self._not_found(request, "EntryNotFound", "Entry not found")
        # /{org}/{name}/resolve/{rev}/{path...}
        if len(parts) >= 5 and parts[2] == "resolve":
            repo_id = f"{parts[0]}/{parts[1]}"
            found = self._repo(repo_id)
            if found is None:
                return self._not_found(request, "RepoNotFound", "Repository not found", 401)
            files, sha = found
            filename = "/".join(parts[4:])
            data = files.get(filename)
            if data is None:
                return self._not_found(request, "EntryNotFound", "Entry not found")
            etag = hashlib.sha1(data).hexdigest()
            return httpx.Response(200, request=request, headers={
                "Content-Type": "application/json" if filename.endswith(".json") else "application/octet-stream",
                "Content-Length": str(len(data)), "ETag": f'"{etag}"', "X-Repo-Commit": sha,
                "Accept-Ranges": "bytes",
            }, content=b"" if request.method == "HEAD" else data)
        return self._not_found(request, "EntryNotFound", "Entry not found")


def install_fixture_hub() -> None:
    """Route every ``huggingface_hub`` HTTP call to :class:`FixtureHub`."""
    import httpx
    from huggingface_hub.utils import _http as hf_http

    class _Transport(httpx.BaseTransport):
        def __init__(self) -> None:
            self.hub = FixtureHub()

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            return self.hub.handle_request(request)

    class _AsyncTransport(httpx.AsyncBaseTransport):
        def __init__(self) -> None:
            self.hub = FixtureHub()

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            return self.hub.handle_request(request)

    hf_http.set_client_factory(lambda: httpx.Client(
        transport=_Transport(), event_hooks={"request": [hf_http.hf_request_event_hook]},
        follow_redirects=True, timeout=None))
    hf_http.set_async_client_factory(lambda: httpx.AsyncClient(
        transport=_AsyncTransport(), event_hooks={"request": [hf_http.async_hf_request_event_hook]},
        follow_redirects=True, timeout=None))

