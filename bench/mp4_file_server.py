"""Serve one MP4 the way vLLM-Omni serves `GET /v1/videos/{id}/content`: Starlette's FileResponse
under uvicorn, on 127.0.0.1 (upstream's api_server.py returns `FileResponse(path, media_type,
filename)`; FileResponse answers `Range` with 206). The download benches use it where no real
server is at hand; it needs starlette and uvicorn (the server venv has both).

    python bench/mp4_file_server.py FILE PORT      # the caller polls the port until it answers
"""
from __future__ import annotations

import sys


def main() -> int:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import FileResponse
    from starlette.routing import Route

    path, port = sys.argv[1], int(sys.argv[2])

    async def content(request):  # type: ignore[no-untyped-def]
        video_id = request.path_params["video_id"]
        return FileResponse(path=path, media_type="video/mp4", filename=f"{video_id}.mp4")

    app = Starlette(routes=[Route("/v1/videos/{video_id}/content", content)])
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
