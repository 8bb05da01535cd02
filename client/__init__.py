"""Talking to a running vLLM-Omni server: the /v1/videos HTTP client and MP4 frame decoding.

Plain Python (requests, numpy, PyAV, Pillow); no ComfyUI, no torch.

* `api`         VideoClient (health, models, submit, status, download, delete, generate): a cancel
                as GenerationCancelled, and one job's loop from submit to result.
* `video_jobs`  the /v1/videos endpoints, one HTTP exchange each; job ids quoted and shown safely.
* `job_results` what it hands back: JobState, JobUpdate, GenerationResult, GenerationCancelled.
* `request`     VideoRequest: the multipart form of one Wan2.2 job.
* `bounds`      ClipBounds: the size, frames and bytes a server's clip may have for a request.
* `transport`   the one HTTP layer: session, RetryPolicy, Deadlines, cancel-aware waits, one
                request function (also used by server/process/probe.py).
* `abortable`   worker-thread tries whose blocked reads a cancel or deadline stops at once.
* `exchange_errors`  the exchange failing (refused, cut, past a deadline, over a cap) and
                `http_errors` the server's error answers, as LauncherError text naming the setting
                to change.
* `request_fields`  the numeric request fields (steps, guidance, sizes, frames, fps, seed...): their
                ranges declared once, read by the node widgets, the CLI, the core check and the errors.
* `frames`      decode_mp4 (MP4 -> float32 [F, H, W, 3] in 0..1, one preallocated array, checked
                against ClipBounds first) and probe_mp4 (the same checks from the header only).
* `server_mp4`  the one door server bytes reach FFmpeg through: MP4 (ftyp first) only, H.264
                yuv420p only, a decoder bounded to the header's frame size.
* `clip_memory` the memory cap on decoded frames (local config max_clip_memory_gib): one clip, or all
                of a batch's clips together, checked before a job whose frames are decoded is sent.
* `server_json` a server's JSON parsed within size and depth bounds.
* `images`      image_to_png (IMAGE -> PNG bytes at the request's size for I2V uploads).
* `streamed_download`  the MP4 decoded while it downloads (a Range request fetches its index);
                `body_buffer` the buffer both answers fill and the decoder reads, blocking.
* `local_result` a server of ours on this machine: the finished MP4 read from its storage folder
                instead of downloaded (checked open; any doubt falls back to the download).
* `batch`       several jobs submitted together, polled together, each decoded as it completes.
"""
