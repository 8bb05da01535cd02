"""Talking to a running vLLM-Omni server: the /v1/videos HTTP client and MP4 frame decoding.

Plain Python (requests, numpy, PyAV, Pillow); no ComfyUI, no torch.

* `api`    VideoRequest (the multipart form), VideoClient (health, models, submit, status,
           download, delete, generate), JobState, JobUpdate, GenerationResult,
           GenerationCancelled.
* `http`   the session, bounded retries with backoff, and upstream errors turned into
           LauncherError text naming the setting to change.
* `frames` decode_mp4 (MP4 -> float32 [F, H, W, 3] in 0..1, one preallocated array) and
           image_to_png (IMAGE -> PNG bytes for I2V uploads).
"""
