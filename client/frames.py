"""MP4 bytes to a ComfyUI-shaped IMAGE array (the other way, IMAGE to PNG for uploads: images.py).

A Wan2.2 clip is large once it is float32: 121 frames at 1280x704 are 1.3 GB. So decoding
writes each frame straight into one preallocated [F, H, W, 3] float32 array with a single
fused multiply (uint8 RGB * 1/255 -> float32), never a list of frames and never a
`np.stack` of the whole clip. The rgb24 conversion and that write run on a few threads
beside FFmpeg's own decoder threads (both release the GIL), two frames per thread in
flight at most; serial, they were about as long as the decode itself. Each of those threads
keeps one single-threaded scaler for the whole clip (`_rgb24`: PyAV's to_ndarray spawned a
thread per core for every frame). The frame count
comes from the stream header; when a container does not carry it, we estimate it from
duration x rate and grow the array in place in large steps (`ndarray.resize`, which reallocates without holding two copies when
the allocator can extend the block).

A server's MP4 is untrusted: it is opened only through server_mp4.py (an MP4 starting with
`ftyp`, the MP4 demuxer and no other, H.264 yuv420p only, a decoder bounded to the header's frame
size); each packet is looked at before the decoder sees it (its NAL headers: no new frame size),
and every frame must have the header's size and format (one compare each); with `bounds`
(what the request allows, see bounds.py) the stream's width, height and header frame count are
checked before anything is allocated, the array never holds more frames than the request
allows, and decoding stops with the launcher's own error at the first frame past that.

Plain Python + numpy + PyAV: no ComfyUI and no torch here. The node layer turns
the array into a tensor with `torch.from_numpy` (no copy).
"""
from __future__ import annotations

import io
import math
import os
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO, Optional, Union

import numpy as np

from ..errors import LauncherError
from .bounds import ClipBounds
from .server_mp4 import SizeGuard, bound_decoder, frame_changed, grown_frames, open_server_mp4, unreadable

_SCALE = np.float32(1.0 / 255.0)
_MIN_GROW = 32           # frames added at least when the estimate was short
_GROW_FACTOR = 0.5       # ...or half the current capacity, whichever is larger
MAX_WORKERS = 8          # conversion threads at most (memory bandwidth, not cores, limits beyond)
THREAD_TYPE = "AUTO"     # the decoder's PyAV thread_type
AVIO_BUFFER_BYTES = 32 << 10   # FFmpeg's read size from a file object (PyAV's default): one Python call each


@dataclass
class DecodedVideo:
    """Decoded frames [F, H, W, 3] float32 in 0..1 (C-contiguous) and the clip's frame rate."""

    frames: np.ndarray
    fps: float

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])

    @property
    def width(self) -> int:
        return int(self.frames.shape[2])

    @property
    def height(self) -> int:
        return int(self.frames.shape[1])

    @property
    def info(self) -> "VideoInfo":
        return VideoInfo(self.width, self.height, self.num_frames, self.fps)

    def __repr__(self) -> str:  # never print 1 GB of floats
        return (f"DecodedVideo(frames={self.num_frames}x{self.height}x{self.width}x3 "
                f"{self.frames.dtype}, fps={self.fps:g})")


@dataclass(frozen=True)
class VideoInfo:
    """What an MP4's header says about its video stream (probe_mp4: no frame decoded)."""

    width: int
    height: int
    num_frames: int
    fps: float


class PreparedOutput:
    """A float32 [F, H, W, 3] array for a clip still being made, its pages first touched now.

    Fresh memory costs a page fault (and the kernel's zeroing) per page at its first write: for
    1280x704x121 (1.3 GB) touching it takes 0.06 s on 8 threads of the H200 box's 16 cores, and
    decoding into touched memory was 0.017 s faster (0.216 against 0.233 s). The video client
    starts this once the job is due (its last denoise step seen, or its estimate reached), so
    the touching runs while the GPU finishes; `take()` hands the array to decode_mp4 (`into`),
    which uses it only when the stream's header says exactly this shape."""

    def __init__(self, frames: int, height: int, width: int, workers: Optional[int] = None) -> None:
        self.shape = (frames, height, width, 3)
        self._array: Optional[np.ndarray] = np.empty(self.shape, dtype=np.float32)
        self._thread = threading.Thread(target=self._touch, args=(workers or default_workers(),),
                                        name="vllm-omni-output", daemon=True)
        self._thread.start()

    def _touch(self, workers: int) -> None:
        array = self._array
        if array is None:
            return
        with ThreadPoolExecutor(workers, thread_name_prefix="vllm-omni-output") as pool:
            list(pool.map(lambda i: array[i].fill(0.0), range(array.shape[0])))

    def take(self) -> Optional[np.ndarray]:
        """The array (once; None after), after the touching finished."""
        self._thread.join()
        array, self._array = self._array, None
        return array

    def drop(self) -> None:
        """Not needed after all (the job failed or was cancelled): free it once the touching ends."""
        self.take()


def _import_av() -> Any:
    try:
        import av  # noqa: PLC0415 (lazy: importing PyAV costs ~100 ms and the CLI may not need it)
    except ImportError as exc:  # pragma: no cover - av is a hard requirement
        raise LauncherError(
            "Cannot decode the video: PyAV is not installed",
            "the launcher reads the server's MP4 with PyAV (the 'av' package)",
            "install it into ComfyUI's Python: pip install av",
            raw=str(exc),
        ) from exc
    return av


def _ffmpeg_error(av: Any) -> type:
    """PyAV's error base class (av.FFmpegError since 13, av.error.FFmpegError before)."""
    return getattr(av, "FFmpegError", None) or av.error.FFmpegError


def _stream_fps(stream: Any) -> float:
    for rate in (stream.average_rate, getattr(stream, "guessed_rate", None), stream.base_rate):
        if rate:
            value = float(rate)
            if value > 0 and math.isfinite(value):
                return value
    return 0.0


def _expected_frames(container: Any, stream: Any, fps: float) -> int:
    """Frame count from the header, else estimated from duration x rate (+ margin), else 0."""
    if stream.frames and stream.frames > 0:
        return int(stream.frames)
    seconds = 0.0
    if stream.duration and stream.time_base:
        seconds = float(stream.duration * stream.time_base)
    elif container.duration:
        seconds = container.duration / 1_000_000  # av.time_base is microseconds
    if seconds > 0 and fps > 0:
        return int(math.ceil(seconds * fps)) + 2
    return 0


def default_workers() -> int:
    """Conversion threads beside the decoder: one per core up to MAX_WORKERS (measured on 2
    cores, 1280x704x49: serial 0.57 s, 1 thread 0.55, 2 threads 0.39; the decoder's threads
    wait on the conversion as often as not, so sharing the cores pays)."""
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


class _Converter:
    """Frames -> rows of `out`, on a few threads: rgb24 (swscale, which runs without the GIL)
    and the fused float32 write (numpy, likewise). At most 2 frames per thread are in flight,
    so decoded frames never pile up; `drain()` before `out` is reallocated or returned."""

    def __init__(self, workers: int) -> None:
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="vllm-omni-decode") if workers > 0 else None
        self._limit = 2 * workers
        self._pending: deque[Future[None]] = deque()

    def put(self, frame: Any, out: np.ndarray, index: int, width: int, height: int) -> None:
        if self._pool is None:
            _convert(frame, out, index, width, height)
            return
        while len(self._pending) >= self._limit:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(_convert, frame, out, index, width, height))

    def drain(self) -> None:
        while self._pending:
            self._pending.popleft().result()

    def close(self) -> None:
        for future in self._pending:
            future.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def _convert(frame: Any, out: np.ndarray, index: int, width: int, height: int) -> None:
    np.multiply(_rgb24(frame, width, height), _SCALE, out=out[index])


_scalers = threading.local()      # one VideoReformatter (one SwsContext) per converting thread


def _rgb24(frame: Any, width: int, height: int) -> np.ndarray:
    """The frame as uint8 RGB [H, W, 3] (a view of a fresh rgb24 frame), scaled to width x height.

    `frame.to_ndarray(format="rgb24")` gives the same values, but PyAV makes a new
    VideoReformatter for every frame object, so every frame built a new SwsContext, and PyAV asks
    swscale for `threads=0` (one slice thread per core: 16 threads spawned and joined per frame on a
    16-core box, beside the decoder's own 16 and our converters). Here each converting thread keeps
    one reformatter for the whole clip and scales single-threaded (the converters are the
    parallelism); swscale's output rows do not depend on its slicing, so the values are identical
    (tests/unit/test_overhead_scaler.py)."""
    reformatter = getattr(_scalers, "reformatter", None)
    if reformatter is None:
        from av.video.reformatter import VideoReformatter  # noqa: PLC0415 (PyAV is imported lazily)

        reformatter = _scalers.reformatter = VideoReformatter()
        _scalers.options = {"threads": 1}
    options = {**_scalers.options, **({} if frame.width == width and frame.height == height
                                      else {"width": width, "height": height})}
    try:
        rgb = reformatter.reformat(frame, format="rgb24", **options)
    except TypeError:
        if "threads" not in _scalers.options:
            raise
        _scalers.options = {}     # PyAV before `threads` (its swscale was single-threaded then): once per thread
        return _rgb24(frame, width, height)
    return rgb.to_ndarray()


def decode_mp4(data: Union[bytes, BinaryIO], *, bounds: Optional[ClipBounds] = None, threads: int = 0,
               workers: Optional[int] = None, into: Optional[np.ndarray] = None,
               thread_type: str = THREAD_TYPE, buffer_size: int = AVIO_BUFFER_BYTES) -> DecodedVideo:
    """Decode an MP4 (H.264 yuv420p from vLLM-Omni) into float32 [F, H, W, 3] in 0..1.

    `data`: the bytes, or a seekable binary file (body_buffer.BufferReader: a download still
    arriving, whose reads wait for their bytes; its errors come out of here unchanged).
    `bounds`: the clips the request allows; a stream outside them is refused (LauncherError)
    before its frames are allocated. Without it size and count are not checked (our own files);
    either way the bytes open only as an MP4 of H.264 yuv420p (server_mp4.py), and a frame of
    another size or format than the header's is refused (LauncherError) before it is converted.
    `threads`: decoder threads, 0 = FFmpeg's choice (cores + 1, at most 16). `thread_type`:
    PyAV's ("AUTO": frame and slice threading; upstream's x264 writes one slice per frame, so
    frame threading does the work). `buffer_size`: the bytes FFmpeg asks of `data` per read (each
    read of a file object is a Python call). `workers`: threads converting decoded frames while the decoder
    goes on (None: default_workers(); 0: convert inline, one frame after the other). `into`: a
    float32 [F, H, W, 3] array made beforehand (OutputArray): used when the stream's header
    says exactly that shape, so its pages are not first touched on the decode's path.
    Raises LauncherError when the bytes are not a decodable video.
    """
    av = _import_av()
    if isinstance(data, (bytes, bytearray, memoryview)):
        source: BinaryIO = io.BytesIO(data)
        size = len(data)
    else:
        source = data
        size = source.seek(0, io.SEEK_END)
        source.seek(0)
    if not size:
        raise _empty_video()
    container, stream = open_server_mp4(av, source, size, buffer_size)
    with container:
        width, height = stream.codec_context.width, stream.codec_context.height
        pix_fmt = stream.codec_context.format.name
        guard = SizeGuard(stream.codec_context)
        bound_decoder(stream, threads, thread_type)
        fps = _stream_fps(stream)
        capacity = _expected_frames(container, stream, fps)
        most = bounds.max_frames if bounds is not None else None
        if bounds is not None:
            bounds.check(width, height, int(stream.frames) if stream.frames and stream.frames > 0 else None)
            capacity = min(capacity or most, most)
        shape = (capacity or _MIN_GROW, height, width, 3)
        fits = into is not None and into.shape == shape and into.dtype == np.float32 and into.flags.c_contiguous
        out = into if fits and into is not None else np.empty(shape, dtype=np.float32)
        owned = out is not into            # `into` is the caller's: never resized in place
        capacity, count = out.shape[0], 0
        converter = _Converter(default_workers() if workers is None else workers)
        try:
            for sample, packet in enumerate(container.demux(stream)):
                guard.check(packet, width, height, sample)    # before the decoder sees a new frame size
                for frame in packet.decode():
                    if frame.width != width or frame.height != height or frame.format.name != pix_fmt:
                        raise frame_changed(width, height, frame, count)
                    if count == capacity:
                        if most is not None and count >= most:
                            raise bounds.mismatch(width, height, f"{most + 1}+")
                        capacity += max(_MIN_GROW, int(capacity * _GROW_FACTOR))
                        capacity = min(capacity, most) if most is not None else capacity
                        converter.drain()             # no thread may write into the block being moved
                        out, owned = _resized(out, capacity, owned), True
                    converter.put(frame, out, count, width, height)
                    count += 1
            converter.drain()
        except _ffmpeg_error(av) as exc:
            grown = grown_frames(width, height, stream.codec_context, count)
            if grown is not None:
                raise grown from exc
            if count == 0:
                raise unreadable(size, exc) from exc
            raise LauncherError(
                f"The video is damaged after frame {count}",
                "FFmpeg could not decode the rest of the downloaded MP4 (cut-off download or encoder fault)",
                "run the prompt again; if it repeats, check the server log",
                raw=str(exc),
            ) from exc
        finally:
            converter.close()
    if count == 0:
        raise LauncherError(
            "The server's video has no frames",
            "the MP4 decoded to zero frames",
            "check that frames is at least 1 and look at the server log",
            setting="frames",
        )
    if bounds is not None and count < bounds.min_frames:
        raise bounds.mismatch(width, height, count)
    if count != capacity:
        out = _resized(out, count, owned)
    return DecodedVideo(out, fps)


def _resized(out: np.ndarray, frames: int, owned: bool) -> np.ndarray:
    """`out` with room for `frames` frames: resized in place when this decode allocated it (no
    copy when the allocator can move the block), else copied into a new array."""
    if owned:
        out.resize((frames, *out.shape[1:]), refcheck=False)
        return out
    new = np.empty((frames, *out.shape[1:]), dtype=out.dtype)
    keep = min(frames, out.shape[0])
    new[:keep] = out[:keep]
    return new


def probe_mp4(data: bytes, *, bounds: Optional[ClipBounds] = None) -> VideoInfo:
    """Check that `data` is a video file as the request allows, from its header only (no frame is
    decoded): it opens as an MP4 of H.264 yuv420p (server_mp4.py, as for decode_mp4), and its
    size and header frame count fit `bounds`. For callers that only hand the MP4 on (the CLI
    without --frames-npy). Raises LauncherError otherwise."""
    av = _import_av()
    if not data:
        raise _empty_video()
    container, stream = open_server_mp4(av, io.BytesIO(data), len(data), AVIO_BUFFER_BYTES)
    with container:
        width, height = stream.codec_context.width, stream.codec_context.height
        fps = _stream_fps(stream)
        frames = int(stream.frames) if stream.frames and stream.frames > 0 else None
        if bounds is not None:
            bounds.check(width, height, frames)
        if frames is None:
            raise LauncherError(
                "The server's video does not say how many frames it has",
                "its MP4 header carries no frame count, so it cannot be checked without decoding it "
                "(vLLM-Omni's MP4s always carry one)",
                "check the server log; --frames-npy decodes (and so checks) every frame", setting="server")
        return VideoInfo(width, height, frames, fps)


def _empty_video() -> LauncherError:
    return LauncherError(
        "The server returned an empty video file",
        "the /content download had no bytes; the job's MP4 was missing or cut off",
        "run the prompt again; if it repeats, check the server log",
    )


__all__ = ["DecodedVideo", "PreparedOutput", "VideoInfo", "decode_mp4", "probe_mp4"]
