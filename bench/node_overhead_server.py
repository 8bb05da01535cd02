"""A vLLM-Omni-like job API for bench/node_overhead.py: every job "runs" for JOB_S seconds, then its MP4 is
one file served the way upstream serves `GET /v1/videos/{id}/content` (Starlette's FileResponse under uvicorn
on 127.0.0.1, which answers `Range` with 206). Its status answers carry upstream's fields (`status`,
`inference_time_s`, `completed_at`) and `completed_at_precise` (time.time() when the job turned completed, to
the microsecond: upstream truncates `completed_at` to whole seconds), so the bench can say how late the client
saw the completion. With STORAGE (a folder of ours, 0700, as launch_prep makes a launched server's), the file
is also stored there as upstream's LocalStorageManager stores a job's MP4 (`STORAGE/<job id>`, in place before
the first answer that says completed; a hard link of FILE, so no copy's time lands in the poll) and removed by the
DELETE, so a client given the folder (client/local_result.py) reads it there. Needs starlette and uvicorn (the
server venv has both).

    python bench/node_overhead_server.py FILE PORT JOB_S [STORAGE]   # the caller polls the port until it answers
"""
from __future__ import annotations

import itertools
import os
import sys
import time


def main() -> int:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import FileResponse, JSONResponse
    from starlette.routing import Route

    path, port, job_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    storage = sys.argv[4] if len(sys.argv) > 4 else ""
    jobs: dict[str, float] = {}           # id -> time.time() of its submit
    ids = itertools.count(1)

    def body(job_id: str) -> dict:
        started = jobs[job_id]
        done = time.time() >= started + job_s
        if done and storage and not os.path.lexists(os.path.join(storage, job_id)):
            os.link(path, os.path.join(storage, job_id))      # stored, then said completed (as upstream)
        return {"id": job_id, "object": "video", "status": "completed" if done else "in_progress",
                "progress": 100 if done else 0, "error": None,
                "completed_at": int(started + job_s) if done else None,
                "completed_at_precise": started + job_s if done else None,
                "inference_time_s": job_s if done else None}

    async def submit(request):  # type: ignore[no-untyped-def]
        await request.form()
        job_id = f"video_gen_{next(ids)}"
        jobs[job_id] = time.time()
        return JSONResponse({"id": job_id, "object": "video", "status": "queued", "progress": 0})

    async def status(request):  # type: ignore[no-untyped-def]
        job_id = request.path_params["video_id"]
        if job_id not in jobs:
            return JSONResponse({"error": {"message": "not found"}}, status_code=404)
        return JSONResponse(body(job_id))

    async def content(request):  # type: ignore[no-untyped-def]
        video_id = request.path_params["video_id"]
        return FileResponse(path=path, media_type="video/mp4", filename=f"{video_id}.mp4")

    async def delete(request):  # type: ignore[no-untyped-def]
        if jobs.pop(request.path_params["video_id"], None) is not None and storage:
            try:
                os.remove(os.path.join(storage, request.path_params["video_id"]))
            except FileNotFoundError:
                pass
        return JSONResponse({"id": request.path_params["video_id"], "deleted": True})

    async def models(request):  # type: ignore[no-untyped-def]
        return JSONResponse({"data": [{"id": "Wan-AI/Wan2.2-TI2V-5B-Diffusers"}]})

    app = Starlette(routes=[Route("/v1/videos", submit, methods=["POST"]),
                            Route("/v1/videos/{video_id}", status, methods=["GET"]),
                            Route("/v1/videos/{video_id}", delete, methods=["DELETE"]),
                            Route("/v1/videos/{video_id}/content", content),
                            Route("/v1/models", models)])
    uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
