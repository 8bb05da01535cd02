"""Which job gets vLLM-Omni 0.30's worker-side MP4 (`extra_params.preencode_mp4`): the one owner of that choice.

With it the Wan pipeline decodes the VAE in temporal chunks straight into the MP4 encoder, so the serving
layer's postprocess and its one-shot encode are skipped: on one H200, TI2V-5B 1280x704x121 took 1.8-2.0 s
less of the server's time per job at 4 and 20 steps, with a lower GPU peak and the same H.264 yuv420p
clip (bench/results/h200-issue25-overhead-and-preencode-vllm-omni-0.30/). Where upstream reads the switch
(0.30; vllm_omni/diffusion/models/wan2_2/):

- pipeline_wan2_2.py:725-726, 981-988 (T2V-A14B, TI2V-5B and FastWan's DMD, which runs in Wan22Pipeline),
  pipeline_wan2_2_i2v.py:521-522, 752-759 (I2V-A14B): `decode_to_mp4` through the VAE's
  `decode_with_chunks` (diffusion/utils/chunked_video.py:463-492).
- pipeline_wan2_2_s2v.py:1199-1200, 1341-1351: each decoded clip goes to the encoder, audio muxed in, at
  its fixed 16 fps (S2V_OUTPUT_FPS, :74), which models.request_for already makes the request's fps.
- VACE (pipeline_wan2_2_vace.py) never reads it: the key would sit unused, so it is not sent.

When it is not sent (each a refusal upstream, or a wrong clip):
- a server before 0.30 (0.26 ignores the key) or one whose version the launcher cannot know (a remote
  server, the CLI's --url): only a server this launcher started is asked;
- VAE tiling, or VAE patch parallel (which turns tiling on, registry.py:475-480): a single-GPU tiled
  decode raises "Wan chunk callbacks are unsupported for spatial tiling"
  (distributed/autoencoders/autoencoder_kl_wan.py:176-184), and the sharded one is unmeasured;
- VAE slicing or request batching (--max-num-seqs above 1): chunked decode refuses slicing with a batch
  (autoencoder_kl_wan.py:86-92), and a batch runs with its first request's switch
  (pipeline_wan2_2.py:685 `common = sampling_params_list[0]`), so one request without it (frame
  interpolation) would get MP4 bytes it cannot interpolate;
- the request's own reasons (client/request.py `worker_mp4_blocker`): frame interpolation or another
  output_type (ValueError, chunked_mp4.py:51-57), a fractional fps (the worker encodes int(fps)).

What does not matter: offload (the VAE stays on the GPU, offloader/sequential_backend.py:342-344), a
per-request LoRA (the DiT only), sequence / CFG parallel (without VAE patch parallel every rank decodes the
whole clip as it would anyway, now each into its own encoder, and one rank's answer is returned:
executor/multiproc_executor.py:796; measured on one GPU only), the codec (the worker's defaults are the serving
encoder's: chunked_mp4.py:13-17, media_utils.py:248-268).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from .flags import Version, batch_width

if TYPE_CHECKING:
    from .spec import LaunchSpec

# The family pipelines (models.WanFamily.pipeline) whose upstream pipeline reads the switch.
READS_PREENCODE = ("wan", "dmd", "s2v")


def server_blocker(spec: "LaunchSpec") -> Optional[str]:
    """Why a server launched from `spec` cannot take the worker-side MP4 (None: it can)."""
    family = spec.family
    if family.pipeline not in READS_PREENCODE:
        return f"{family.label}'s pipeline does not read it"
    if spec.memory.vae_tiling or (spec.parallel.vae_patch > 1 and spec.parallel.world_size > 1):
        return "the VAE decodes in tiles (VAE tiling or VAE patch parallel)"
    if spec.memory.vae_slicing or batch_width(spec.extra_flags) > 1:
        return "the server batches requests (VAE slicing or --max-num-seqs above 1)"
    return None


def settle(request: Any, spec: Optional["LaunchSpec"], version: Optional[Version]) -> None:
    """Decide `request.preencode` where it is undecided (None): True for a server this launcher started
    (`spec`, `version`: its launch and the line its log names) that can take it for this request. A server
    it did not start (None) is never asked. A value already set (the bench's), or one the raw extra_params
    field already gives, is kept."""
    if request.preencode is not None or "preencode_mp4" in request.raw_extra_params():
        return
    request.preencode = (spec is not None and version is not None and server_blocker(spec) is None
                         and request.worker_mp4_blocker(version) is None)


__all__ = ["READS_PREENCODE", "server_blocker", "settle"]
