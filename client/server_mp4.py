"""The one door through which a server's bytes reach FFmpeg: MP4 only, H.264 yuv420p only, a bounded decoder.

A server's answer is untrusted bytes. `av.open` without a format lets those bytes choose the
demuxer: an ffconcat script (`ffconcat version 1.0` / `file output/ComfyUI_00001_.png`) makes
FFmpeg open files relative to ComfyUI's working directory and hand them back as frames, an SDP
text opens UDP sockets and blocks for seconds where Cancel cannot reach it, a playlist fetches
URLs. So every reader of server bytes (frames.decode_mp4 for bytes and for a download still
arriving, frames.probe_mp4 for `generate --out`, and through them single jobs and batches) opens
them here, and only here:

1. The file must start with an `ftyp` box, checked on its first 8 bytes before FFmpeg sees any
   of them. FFmpeg's MP4 muxer, which vLLM-Omni uses, always writes `ftyp` first (fragmented
   MP4 too); no script, playlist or session description can start that way.
2. `av.open(format="mp4")`: the MP4 demuxer and no other. Its external data references stay off
   (`enable_drefs=0`, FFmpeg's default, said explicitly), and `codec_whitelist=h264` means the
   stream probe inside `av.open` can open no decoder but H.264's.
3. The video stream must be what vLLM-Omni encodes: H.264 in yuv420p. 0.30 (read in the
   installed wheel): `/v1/videos` encodes through `diffusion/utils/media_utils.py`
   (`mux_av_video_audio_bytes`, `mux_video_audio_bytes`; Wan's worker-side `ChunkedMP4Encoder`
   and the streaming `FragmentedMP4Muxer` alike): `format="mp4"`, `add_stream("h264")` (libx264),
   `pix_fmt = "yuv420p"`, crf 18, preset ultrafast; a request's `video_codec_options` reaches only
   the encoder's options, never the codec or the pixel format. 0.26 (its wheel is not installed
   here): the same encoder settings, as the repository's H200 runs of 0.26 recorded
   (bench/results/h200-overhead-vllm-omni-0.26: libx264 yuv420p crf 18 preset ultrafast;
   h200-comfyui-e2e-vllm-omni-0.26: the served clip's codec h264). Anything else is refused
   before a frame is decoded.
4. The frame size cannot change: in H.264 it comes from the sequence parameter set (SPS), which
   an MP4 carries in its header (`avcC`). A stream may repeat it in its packets, and a hostile one
   sends a new one there (or as "new extradata" beside a packet) announcing 8192x8192 frames. The
   decoder then sizes its tables for the new frames in every frame thread (measured: 300 MiB for
   16 threads from a 200 KB file, before any frame) and allocates the frames. So `SizeGuard` looks
   at each packet before the decoder does (its NAL headers only: a length and a type byte per NAL,
   one or two per packet for x264's one slice per frame) and refuses a sequence parameter set
   that is not the header's. Behind it: `max_pixels` = the header's frame size (FFmpeg refuses a
   larger frame before allocating it), at most MAX_DECODER_THREADS threads, and a compare per
   decoded frame against the header's size and pixel format (`frame_changed`).

A bytes object costs nothing extra here: the first 8 bytes are a slice. A file object (a download
still arriving) gives them with one read that waits only for them, then is seeked back.
"""
from __future__ import annotations

import io
from typing import Any, BinaryIO, Optional

from ..errors import LauncherError

SERVER_CODEC = "h264"           # the decoder vLLM-Omni's clips need (encoded by libx264)
SERVER_PIX_FMT = "yuv420p"
MAX_DECODER_THREADS = 16        # FFmpeg's own ceiling for its automatic choice (threads=0)
_MP4_OPTIONS = {"codec_whitelist": SERVER_CODEC, "enable_drefs": "0", "use_absolute_path": "0"}
_HEAD = 8                       # a box header: 4 bytes of size, 4 of type
_ALIGN_W, _ALIGN_H = 128, 32    # FFmpeg checks max_pixels against its aligned width and coded height


def open_server_mp4(av: Any, source: BinaryIO, size: int, buffer_size: int) -> tuple[Any, Any]:
    """(container, video stream) of the server's MP4 in `source` (`size` bytes, at offset 0),
    refused with the launcher's own LauncherError unless it is an MP4 holding H.264 yuv420p video
    (see the module docstring). The caller closes the container (`with container:`); on a refusal
    it is closed here. `av` is the imported PyAV module."""
    head = _head(source)
    if len(head) < _HEAD or head[4:8] != b"ftyp" or int.from_bytes(head[:4], "big") not in range(_HEAD, size + 1):
        raise _not_mp4(size, head)
    ffmpeg_error = getattr(av, "FFmpegError", None) or av.error.FFmpegError
    try:
        container = av.open(source, mode="r", format="mp4", buffer_size=buffer_size, options=dict(_MP4_OPTIONS))
    except ffmpeg_error as exc:
        raise unreadable(size, exc) from exc
    try:
        if not container.streams.video:
            raise LauncherError(
                "The server's file has no video stream",
                f"{size} bytes were downloaded but FFmpeg found no video track in them",
                "check the server log for an encoder error; try the job again")
        stream = container.streams.video[0]
        codec, pix_fmt = stream.codec_context.name, _pix_fmt(stream.codec_context)
        if codec != SERVER_CODEC or pix_fmt != SERVER_PIX_FMT:
            raise _wrong_codec(codec, pix_fmt)
    except BaseException:
        container.close()
        raise
    return container, stream


class SizeGuard:
    """Refuses, before the decoder sees it, a packet that would give the decoder other H.264 sequence
    parameters (a new frame size) than the MP4 header's `avcC` (see the module docstring)."""

    _SPS_TYPES = frozenset({7, 13, 15})      # sequence parameter set, its extension, subset SPS (SVC/MVC)

    def __init__(self, ctx: Any) -> None:
        extra = bytes(ctx.extradata or b"")
        if len(extra) < 7 or extra[0] != 1:
            raise LauncherError(
                "The server's H.264 video has no avcC header",
                "FFmpeg's MP4 muxer (vLLM-Omni's) always keeps H.264's sequence parameters, which fix the "
                "frame size, in an avcC box; without one the size could not be held to the header's, so no "
                "frame was decoded", "check which program answers at the server URL and its log", setting="server")
        self._size_bytes = (extra[4] & 3) + 1
        self._known: set[bytes] = set()
        pos = 6
        for _ in range(extra[5] & 0x1F):             # avcC: its sequence parameter sets, each with a 16-bit length
            length = int.from_bytes(extra[pos:pos + 2], "big")
            self._known.add(extra[pos + 2:pos + 2 + length])
            pos += 2 + length

    def check(self, packet: Any, width: int, height: int, after: int) -> None:
        """Raise LauncherError when `packet` (the stream's sample `after`: an MP4 sample is one frame)
        brings sequence parameters the header does not have."""
        if getattr(packet, "has_sidedata", None) is not None and packet.has_sidedata("new_extradata"):
            raise _changed(width, height, "new H.264 parameters beside a packet", after)
        data = memoryview(packet) if packet.size else b""
        end, step, pos = len(data), self._size_bytes, 0
        while pos + step < end:
            length = int.from_bytes(data[pos:pos + step], "big")
            if data[pos + step] & 0x1F in self._SPS_TYPES and bytes(data[pos + step:pos + step + length]) \
                    not in self._known:
                raise _changed(width, height, "a new H.264 sequence parameter set in its stream", after)
            pos += step + length


def bound_decoder(stream: Any, threads: int, thread_type: str) -> None:
    """Bound the stream's decoder before its first packet: frames no larger than the header says
    (`max_pixels`, checked by FFmpeg before it allocates one) and at most MAX_DECODER_THREADS
    threads (0: FFmpeg's choice, which stays within that)."""
    ctx = stream.codec_context
    stream.thread_type = thread_type
    ctx.thread_count = min(max(0, int(threads)), MAX_DECODER_THREADS)
    width, height = ctx.width, ctx.height
    most = -(-width // _ALIGN_W) * _ALIGN_W * (-(-height // _ALIGN_H) * _ALIGN_H)
    ctx.options = {**(ctx.options or {}), "max_pixels": str(max(1, most))}


def frame_changed(width: int, height: int, frame: Any, after: int) -> LauncherError:
    """The refusal of a frame whose size or pixel format is not the header's (`after` frames were fine)."""
    fmt = frame.format.name if frame.format is not None else "?"
    return _changed(width, height, f"{frame.width}x{frame.height} {fmt}", after)


def grown_frames(width: int, height: int, ctx: Any, after: int) -> Optional[LauncherError]:
    """When FFmpeg refused the stream after `after` frames because its frames changed size (the
    decoder's context now says another size: `max_pixels` stopped it), that refusal; else None."""
    if (ctx.width, ctx.height) in ((width, height), (0, 0)):
        return None
    return _changed(width, height, f"{ctx.width}x{ctx.height}", after)


def _changed(width: int, height: int, got: str, after: int) -> LauncherError:
    return LauncherError(
        f"The server's video changes its frame size after frame {after}: {got}, where its header says "
        f"{width}x{height} {SERVER_PIX_FMT}",
        "vLLM-Omni encodes every frame of a clip at one size; frames of another size or format are what a "
        "hostile server sends to exhaust memory, so the launcher stopped decoding before allocating them",
        "check which program answers at the server URL and its log", setting="server")


def unreadable(size: int, exc: BaseException) -> LauncherError:
    """FFmpeg could not read the (ftyp-headed) MP4 at all: a cut-off or damaged file."""
    return LauncherError(
        "The server's file is not a readable video",
        f"FFmpeg could not open the {size} downloaded bytes as MP4",
        "run the prompt again; if it repeats, check the server log", raw=str(exc))


def _head(source: BinaryIO) -> bytes:
    """The first _HEAD bytes of `source` (a read may be short: ask again), then back to offset 0."""
    source.seek(0)
    head = b""
    while len(head) < _HEAD:
        part = source.read(_HEAD - len(head))
        if not part:
            break
        head += part
    source.seek(0, io.SEEK_SET)
    return head


def _pix_fmt(ctx: Any) -> str:
    """The stream's pixel format; "" when the probe could not tell (its decoder was never opened)."""
    fmt = ctx.format
    return fmt.name if fmt is not None else ""


def _shown(head: bytes) -> str:
    """The first bytes for a message: printable ASCII as is, the rest escaped (never a control)."""
    return repr(head)[2:-1] or "nothing"


def _not_mp4(size: int, head: bytes) -> LauncherError:
    return LauncherError(
        "The server's file is not an MP4",
        f"its {size} bytes start with '{_shown(head)}', where every MP4 (and every vLLM-Omni clip) starts "
        "with an 'ftyp' box; the launcher decodes a server's output only as MP4 (H.264), so FFmpeg never "
        "opened it (nothing it names was read)",
        "check which program answers at the server URL and its log", setting="server")


def _wrong_codec(codec: str, pix_fmt: str) -> LauncherError:
    return LauncherError(
        f"The server's video is {' '.join(filter(None, (codec, pix_fmt)))}, not H.264 {SERVER_PIX_FMT}",
        "vLLM-Omni (0.26 and 0.30) encodes every /v1/videos clip as H.264 yuv420p in MP4, and the launcher "
        "decodes nothing else from a server, so no frame of this one was decoded",
        "check which program answers at the server URL and its log", setting="server")


__all__ = ["MAX_DECODER_THREADS", "SERVER_CODEC", "SERVER_PIX_FMT", "SizeGuard", "bound_decoder", "frame_changed",
           "grown_frames", "open_server_mp4", "unreadable"]
