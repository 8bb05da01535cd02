"""Peak GPU memory of a vLLM-Omni Wan2.2 server, per GPU, as named terms.

`plan(spec, request, gpus)` answers "will this launch spec run this request on these GPUs,
and with how much to spare?" before any process starts. The estimate follows what the
0.30 code does (file references are to the vllm-omni 0.30.0 wheel):

* Weights are loaded in bf16, the VAE too. Both A14B experts stay resident; server
  `--boundary-ratio 1.0` loads only `transformer_2`, `0.0` only `transformer`
  (`pipeline_wan2_2.py:427-457`). The UMT5-XXL text encoder stays on every rank, unsharded
  by TP and HSDP (HSDP shards only the transformer blocks, `_hsdp_shard_conditions`).
* Denoising keeps one block's activations at a time (inference), so the working set is
  linear in the tokens a rank holds: latent frames (F-1)/4+1 x (H/vae/2) x (W/vae/2),
  divided by the Ulysses/ring degree. CFG runs the two branches one after another
  (`distributed/cfg_parallel.py:155-157`), so CFG does not double the activations; CFG
  parallel gives each rank one branch. Request batching (`batch` > 1) does multiply them.
* The pipeline empties the CUDA cache before the VAE decode (`pipeline_wan2_2.py:952-955`),
  so the decode is its own phase: weights + decode working set (+ the allocator slack a
  serving process adds, see `decode_server_slack`). Untiled, the Wan VAE decodes one latent
  frame at a time at full resolution, so its working set grows with H x W and barely with
  frames (only the output, F x H x W); tiled (256-pixel tiles, diffusers' default) it is
  tile-sized plus the decoded tiles kept for blending and the blended copies, so it grows
  with F x H x W. Both measured on an H200 (bench/memory/results/h200-vae-decode.json).
  `--vae-patch-parallel-size` turns tiling on (`registry.py:475-480`), spreads tiles over
  ranks and gathers them on rank 0. `--vae-use-slicing` only splits a batch, so it saves nothing at batch 1.
* I2V-A14B encodes its condition video (the image plus F-1 black frames) at full
  resolution before denoising (`pipeline_wan2_2_i2v.py`), a third phase.
* Module offload swaps the text encoder and each DiT expert (only one of them on the GPU
  at a time, `offloader/sequential_backend.py:186-191`); layerwise offload streams DiT
  blocks with about two resident per expert, the text encoder stays; FP8 halves the
  DiT's linear weights (upstream marks Wan2.2 quantization unvalidated).

What was measured rather than derived: the VAE decode coefficients in `CALIBRATION`
(isolated decode on an H200, bench/memory); the per-token coefficients and the allocator
slack/carry/workspace terms are fitted to vLLM-Omni's published peaks (`max_memory_reserved`,
in MiB) and the H200 runs (docs/upstream-facts.md, "Published memory peaks" and "H200
measurements"); tests/unit/test_plan_memory.py checks each.
All sizes are GiB (2**30 bytes); GPU "GB" (80 GB H100, 24 GB 4090) are GiB in practice.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence, Union

from ..models import WanFamily
from ..server.spec import LaunchSpec
from .gpus import GpuInfo, hypothetical_gpus, query_gpus
from .model_sizes import GIB, ModelSizes, model_sizes

# --------------------------------------------------------------------------------------
# Calibration. Each value: what it is, and what fixed it.
CALIBRATION: dict[str, float] = {
    # DiT activation working set per token, in bf16 hidden vectors (hidden x 2 bytes).
    # Fitted to the published I2V-A14B peaks (docs/upstream-facts.md, "Published memory
    # peaks"): the 2-GPU
    # 480p -> 720p/121 step (16,380 -> 55,800 tokens per rank, +9.4 GiB) sets the slope.
    "act_units": 23.3,
    # Of those, the part that tensor parallel does not split (residual stream, norms).
    "act_units_replicated": 5.0,
    # (On CPU, one real-width diffusers layer allocates 11.5-12.1 units for A14B at 3,120 and
    # 7,200 tokens: bench/memory/results/cpu-dit-frames5.json. The GPU figure is reserved
    # memory, with allocator slack and FlashAttention/compile workspaces.)
    # TI2V-5B (expand_timesteps): the per-token timestep modulation, 6 x hidden in fp32,
    # plus the (table + temb) sum: 2 x 6 x hidden x 4 bytes = 24 bf16 hidden units
    # (vllm-omni wan2_2_transformer.py:744-754; the CPU layer measures 34.3 units in all,
    # 22-23 above A14B's).
    "temb_units_ti2v": 24.0,
    # VAE decode, MEASURED on an H200 (bench/memory/results/h200-vae-decode.json: real Wan2.1 /
    # Wan2.2 VAE architectures, random bf16 weights, diffusers 0.38, torch 2.11; reserved bytes
    # above weights + latent). Untiled, the decode runs one latent frame at a time (causal chunks),
    # so its working set grows with H x W only: per output pixel of one frame, bytes, per VAE kind
    # (minimax over 832x480 and 1280x720/704 at 81 and 121 frames; every point within 3.2%).
    "vae_decode_px_wan2.1": 16230.0,
    "vae_decode_px_wan2.2": 18020.0,
    # What grows with frames untiled: the decoded video, one bf16 copy (allocated peak grows by
    # exactly one video from 81 to 121 frames; the reserved peak not at all, the slack absorbs it).
    "video_copies": 1.0,
    # Tiled (256-px tiles, stride 192): a tile's working set (GiB, fitted intercept) plus all
    # decoded tiles kept for blending ((256/192)^2 overlap) plus the blended/concatenated/clamped
    # copies of the video (fitted slope 4.50 videos in all, minus the overlap). Every measured
    # tiled point within 7.1%.
    "vae_decode_tile_gib": 0.69,
    "tile_overlap": (256 / 192) ** 2,
    "video_copies_tiled": 4.50 - (256 / 192) ** 2,
    # In the server the decode runs after the denoise, in an allocator already carved up by it:
    # the H200 "memory after job" (docs/upstream-facts.md, "H200 measurements") is 24.3 GiB
    # above weights + context for
    # T2V-A14B 1280x720x81 and 24.0 GiB for TI2V-5B 1280x704x121, where the isolated decode
    # reserves 14.4 and 15.6 GiB. The difference (0.69 and 0.53 of the decode) is allocator slack
    # the decode leaves reserved in a long-running process: blocks of the denoise that
    # empty_cache() cannot return (segments still holding a live tensor: latents, prompt
    # embeddings, scheduler state) and the decode's per-chunk sizes not fitting those cached
    # blocks, so it maps new segments (inferred, not measured inside the server). Counted as a
    # fraction of the measured decode (fitted 0.6; tiled too: it brings the five tiled
    # patch-parallel after-job points closer, -0.2% to -5.1%);
    # it is reserved, not used, so it matters for what the GPU must have free.
    "decode_server_slack": 0.6,
    # I2V condition encode (Wan2.1 VAE encoder at full resolution), bytes per pixel: assumed 60%
    # of the 27 KB/px decode figure the after-job fit used to imply (no number isolates it yet;
    # bench/memory `--only vae_encode` measures it). Kept conservative until that run is folded in.
    "vae_encode_px_wan2.1": 16000.0,
    # Part of what the decode leaves reserved (decode + decode_server_slack) that stays into the
    # next request's denoise (nothing empties the cache after a request). Fitted: with 0.5 the
    # 1xH100 480p peak lands within 3% (without it -6%); unchanged by the measured decode since
    # decode + slack there (9.9 GiB) is close to the old fitted decode (10.6 GiB).
    "decode_carry": 0.5,
    # Communication workspace kept in the allocator by a parallel mode (all-to-all and
    # all-gather buffers), GiB per rank. Ulysses+HSDP fitted to the 2xH100 peaks (5.2 GiB
    # beyond the gathered blocks); CFG and Ulysses alone to the H200 after-job memory.
    "workspace_ulysses": 3.0,
    "workspace_ring": 3.0,
    "workspace_cfg": 1.5,
    "workspace_tensor": 1.5,
    "workspace_hsdp": 2.2,
    # Outside PyTorch's allocator: CUDA context, cuBLAS/cuDNN workspaces, FlashAttention.
    "cuda_context_gib": 0.75,
    # NCCL communicators and buffers per rank when the world has > 1 GPU.
    "nccl_gib": 0.75,
    # HSDP (FSDP2) gathers a block before running it and prefetches the next one.
    "hsdp_gathered_blocks": 2.0,
    # Layerwise offload keeps about this many blocks per expert on the GPU (current + prefetch).
    "layerwise_resident_blocks": 2.0,
    # FP8: linear weights at 1 byte, the rest (norms, embeddings, modulation) stays bf16.
    "fp8_weight_fraction": 0.52,
    # Safety margin a plan keeps free on every GPU: fraction of the card, and at least this.
    "margin_fraction": 0.03,
    "margin_min_gib": 0.5,
}
TILE_PX = 256            # diffusers AutoencoderKLWan tile_sample_min_height/width
TILE_STRIDE_PX = 192     # tile_sample_stride


@dataclass(frozen=True)
class RequestShape:
    """One request: frame size, frame count, CFG on/off and batch (requests run together)."""

    width: int
    height: int
    frames: int
    cfg: bool = True
    batch: int = 1

    @classmethod
    def default_for(cls, family: WanFamily) -> "RequestShape":
        return cls(family.width, family.height, family.frames)

    def latent(self, family: WanFamily) -> tuple[int, int, int]:
        return ((self.frames - 1) // 4 + 1, self.height // family.vae_spatial, self.width // family.vae_spatial)

    def tokens(self, family: WanFamily) -> int:
        """Sequence length after the 1x2x2 patch embedding."""
        lat_f, lat_h, lat_w = self.latent(family)
        return lat_f * (lat_h // 2) * (lat_w // 2)

    def label(self) -> str:
        return f"{self.width}x{self.height}x{self.frames}" + ("" if self.cfg else " no-CFG") + \
            (f" batch {self.batch}" if self.batch > 1 else "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MemoryTerm:
    """One named share of a GPU's peak: `phase` says when it is alive."""

    name: str
    gib: float
    phase: str          # "resident" | "text" | "encode" | "denoise" | "decode" | "outside"
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "gib": round(self.gib, 3), "phase": self.phase, "note": self.note}


@dataclass
class GpuPlan:
    """The estimate for one rank/GPU."""

    rank: int
    gpu: Optional[GpuInfo]
    terms: list[MemoryTerm]
    phases: dict[str, float]          # resident + phase-specific, PyTorch allocator, GiB
    peak_phase: str
    torch_peak_gib: float             # comparable to vLLM-Omni's reported peak (max_memory_reserved)
    outside_gib: float                # CUDA context + NCCL, not in the allocator
    margin_gib: float
    fits: Optional[bool] = None       # None: no GPU known
    headroom_gib: Optional[float] = None

    @property
    def peak_gib(self) -> float:
        """What the GPU must have free: allocator peak + context/NCCL."""
        return self.torch_peak_gib + self.outside_gib

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "gpu": self.gpu.to_dict() if self.gpu else None,
            "terms": [t.to_dict() for t in self.terms],
            "phases_gib": {k: round(v, 3) for k, v in self.phases.items()},
            "peak_phase": self.peak_phase,
            "torch_peak_gib": round(self.torch_peak_gib, 3),
            "outside_allocator_gib": round(self.outside_gib, 3),
            "peak_gib": round(self.peak_gib, 3),
            "margin_gib": round(self.margin_gib, 3),
            "fits": self.fits,
            "headroom_gib": None if self.headroom_gib is None else round(self.headroom_gib, 3),
        }


@dataclass
class MemoryPlan:
    """Per-GPU estimate for one spec and request, whether it fits, and why."""

    spec: LaunchSpec
    request: RequestShape
    sizes: ModelSizes
    gpus: list[GpuPlan]
    fits: Optional[bool]
    host_ram: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    gpu_source: str = ""

    @property
    def peak_gib(self) -> float:
        return max(g.peak_gib for g in self.gpus)

    @property
    def min_headroom_gib(self) -> Optional[float]:
        rooms = [g.headroom_gib for g in self.gpus if g.headroom_gib is not None]
        return min(rooms) if rooms else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec.to_dict(),
            "flags": self.spec.flags(),
            "request": self.request.to_dict(),
            "tokens": self.request.tokens(self.spec.family),
            "sizes": self.sizes.to_dict(),
            "gpu_source": self.gpu_source,
            "gpus": [g.to_dict() for g in self.gpus],
            "fits": self.fits,
            "peak_gib": round(self.peak_gib, 3),
            "min_headroom_gib": None if self.min_headroom_gib is None else round(self.min_headroom_gib, 3),
            "host_ram": self.host_ram,
            "notes": list(self.notes),
        }

    def text(self) -> str:
        fam = self.spec.family
        lines = [f"{fam.label}  {self.request.label()}  ({self.request.tokens(fam):,} tokens)",
                 f"flags: {' '.join(self.spec.flags()[1:]) or '(single GPU, no memory flags)'}",
                 f"sizes: {self.sizes.source}"]
        for g in self.gpus:
            name = f"GPU {g.gpu.index} {g.gpu.name} ({g.gpu.available_gib:.1f} GiB " \
                   f"{'free' if g.gpu.free_gib is not None else 'total'})" if g.gpu else "GPU ?"
            verdict = {True: "fits", False: "DOES NOT FIT", None: "unknown GPU"}[g.fits]
            room = "" if g.headroom_gib is None else f", headroom {g.headroom_gib:+.1f} GiB"
            lines.append(f"rank {g.rank} on {name}: peak {g.peak_gib:.1f} GiB during {g.peak_phase} -> "
                         f"{verdict}{room}")
            for t in g.terms:
                if t.gib >= 0.005:
                    lines.append(f"    {t.name:<34s} {t.gib:7.2f} GiB  [{t.phase}]" + (f"  {t.note}" if t.note else ""))
            lines.append("    " + "  ".join(f"{k}={v:.1f}" for k, v in g.phases.items()) + " GiB (allocator)")
        if self.host_ram:
            h = self.host_ram
            avail = "unknown" if h.get("available_gib") is None else f"{h['available_gib']:.1f} GiB available"
            lines.append(f"host RAM for offload: needs {h['needed_gib']:.1f} GiB, {avail}"
                         + ("" if h.get("ok") is not False else "  -> NOT ENOUGH"))
        for n in self.notes:
            lines.append(f"note: {n}")
        return "\n".join(lines)


# --------------------------------------------------------------------------------------
GpuArg = Union[None, Sequence[GpuInfo], Sequence[float]]


def _resolve_gpus(spec: LaunchSpec, gpus: GpuArg, nvml: Any = None) -> tuple[list[Optional[GpuInfo]], str]:
    """The GPU each rank runs on, and where that list came from."""
    world = spec.parallel.world_size
    if gpus is None:
        found, reason = query_gpus(nvml)
        if not found:
            return [None] * world, f"no GPU information: {reason}"
        source = "NVML"
        pool: list[GpuInfo] = found
    elif gpus and isinstance(gpus[0], (int, float)):
        pool = hypothetical_gpus([float(x) for x in gpus])   # type: ignore[arg-type]
        source = "given sizes (--gpu-memory)"
    else:
        pool = list(gpus)   # type: ignore[arg-type]
        source = "given GPUs"
    if spec.gpus is not None:
        by_index = {g.index: g for g in pool}
        chosen: list[Optional[GpuInfo]] = [by_index.get(i) for i in spec.gpus[:world]]
    else:
        chosen = list(pool[:world])
    chosen += [None] * (world - len(chosen))
    return chosen, source


def plan(spec: LaunchSpec, request: Optional[RequestShape] = None, gpus: GpuArg = None, *,
         sizes: Optional[ModelSizes] = None, host_available_gib: Optional[float] = -1.0,
         nvml: Any = None, calibration: Optional[dict[str, float]] = None) -> MemoryPlan:
    """Estimate each GPU's peak for `spec` serving `request`.

    gpus: None (ask NVML), a list of GpuInfo, or a list of sizes in GiB (hypothetical cards).
    host_available_gib: -1 asks psutil when offload is on; None means unknown.
    """
    family = spec.family
    request = request or RequestShape.default_for(family)
    sizes = sizes or model_sizes(spec.model)
    cal = dict(CALIBRATION, **(calibration or {}))
    placed, source = _resolve_gpus(spec, gpus, nvml)
    world = spec.parallel.world_size
    notes: list[str] = list(sizes.notes)
    plans = [_rank_plan(spec, request, sizes, family, rank, world, placed[rank], cal, notes)
             for rank in range(world)]
    fits: Optional[bool] = None if any(p.fits is None for p in plans) else all(p.fits for p in plans)
    host = _host_ram(spec, sizes, host_available_gib) if spec.memory.offload != "none" else {}
    if host.get("ok") is False and fits:
        fits = False
        notes.append("host RAM is too small for the offloaded weights (pinned CPU copies)")
    if gpus is None and placed and placed[0] is None:
        notes.append(source)
    _general_notes(spec, request, family, notes)
    return MemoryPlan(spec=spec, request=request, sizes=sizes, gpus=plans, fits=fits, host_ram=host,
                      notes=_dedupe(notes), gpu_source=source)


def _dedupe(items: list[str]) -> list[str]:
    seen: set[str] = set()
    return [x for x in items if not (x in seen or seen.add(x))]


def _loaded_experts(spec: LaunchSpec, sizes: ModelSizes) -> list[int]:
    n = len(sizes.dit_params)
    br = spec.runtime.boundary_ratio
    if n == 2 and br == 1.0:
        return [1]
    if n == 2 and br == 0.0:
        return [0]
    return list(range(n))


def _rank_plan(spec: LaunchSpec, req: RequestShape, sizes: ModelSizes, family: WanFamily, rank: int, world: int,
               gpu: Optional[GpuInfo], cal: dict[str, float], notes: list[str]) -> GpuPlan:
    p, m = spec.parallel, spec.memory
    mode = p.mode
    sp = p.degree if mode in ("ulysses", "ring") else 1
    tp = p.degree if mode == "tensor" else 1
    shard = p.degree if (mode == "hsdp" or (p.hsdp and mode != "none")) else 1
    terms: list[MemoryTerm] = []

    # ---- weights ----------------------------------------------------------------------
    experts = _loaded_experts(spec, sizes)
    wfrac = cal["fp8_weight_fraction"] if m.quantization == "fp8" else 1.0
    expert_gib = [sizes.dit_gib(i) * wfrac for i in experts]
    block_gib = [g * 0.985 / sizes.dit.layers for g in expert_gib]
    dit_all = sum(expert_gib)
    te = sizes.text_encoder_gib
    vae_w = sizes.vae_gib
    what = "both A14B experts" if len(experts) == 2 else ("one A14B expert (boundary_ratio "
                                                          f"{spec.runtime.boundary_ratio:g})" if sizes.dit_params[1:] else "DiT")
    q = " FP8" if m.quantization == "fp8" else " bf16"
    if m.offload == "layerwise":
        resident = sum(g * 0.015 + b * cal["layerwise_resident_blocks"] for g, b in zip(expert_gib, block_gib))
        terms.append(MemoryTerm("DiT weights (layerwise offload)", resident, "resident",
                                f"{what}{q}: ~{cal['layerwise_resident_blocks']:g} blocks per expert on the GPU, "
                                "the rest streamed from pinned host RAM"))
        dit_resident, dit_swapped = resident, 0.0
    elif m.offload == "module":
        biggest = max(expert_gib) / (tp * shard)
        dit_resident, dit_swapped = 0.0, biggest
        terms.append(MemoryTerm("DiT weights (module offload)", biggest, "denoise",
                                f"{what}{q}: one expert on the GPU at a time, swapped with the text encoder"))
    else:
        dit_resident = dit_all / (tp * shard) + (dit_all * 0.02 * (1 - 1 / tp) if tp > 1 else 0.0)
        dit_swapped = 0.0
        how = f", split {tp} ways by TP (norms/embeddings replicated)" if tp > 1 else \
              (f", sharded {shard} ways by HSDP" if shard > 1 else "")
        terms.append(MemoryTerm("DiT weights", dit_resident, "resident", f"{what}{q}{how}"))
    if m.offload == "module":
        terms.append(MemoryTerm("text encoder (module offload)", te, "text",
                                "UMT5-XXL bf16, on the GPU only while encoding the prompt"))
        te_resident = 0.0
    else:
        te_resident = te
        terms.append(MemoryTerm("text encoder", te, "resident",
                                "UMT5-XXL bf16, a full copy on every rank (TP and HSDP do not shard it)"))
    terms.append(MemoryTerm("VAE weights", vae_w, "resident", f"{sizes.vae_kind} VAE bf16"))
    resident = dit_resident + te_resident + vae_w

    # ---- denoise ------------------------------------------------------------------------
    tokens = req.tokens(family)
    tok_rank = -(-tokens // sp)
    hidden_bytes = sizes.dit.hidden * 2
    units_rep = cal["act_units_replicated"]
    units = units_rep + (cal["act_units"] - units_rep) / tp
    act = tok_rank * hidden_bytes * units * req.batch / GIB
    split = f", 1/{sp} of the sequence (Ulysses/ring)" if sp > 1 else ""
    split += f", attention/FFN split {tp} ways (TP)" if tp > 1 else ""
    terms.append(MemoryTerm("DiT activations", act, "denoise",
                            f"{tok_rank:,} tokens on this rank x {units:.1f} hidden vectors{split}"))
    denoise = act
    if family.key == "ti2v_5b":
        temb = tok_rank * hidden_bytes * cal["temb_units_ti2v"] * req.batch / GIB
        terms.append(MemoryTerm("per-token timestep modulation", temb, "denoise",
                                "TI2V-5B expand_timesteps: 6 x hidden fp32 per token"))
        denoise += temb
    lat_f, lat_h, lat_w = req.latent(family)
    latent_gib = lat_f * lat_h * lat_w * family.latent_channels * 4 * req.batch / GIB
    if req.cfg:
        cfg_gib = 2 * latent_gib + 2 * 512 * sizes.dit.text_dim * 2 / GIB
        note = ("CFG parallel: this rank runs one branch" if mode == "cfg" else
                "positive and negative branches run one after another (no doubled activations); "
                "holds the positive prediction and the negative prompt")
        terms.append(MemoryTerm("CFG", cfg_gib, "denoise", note))
        denoise += cfg_gib
    terms.append(MemoryTerm("latents and scheduler state", 3 * latent_gib, "denoise", "fp32"))
    denoise += 3 * latent_gib
    if shard > 1 and m.offload != "layerwise":
        gathered = max(block_gib) * cal["hsdp_gathered_blocks"]
        terms.append(MemoryTerm("HSDP gathered blocks", gathered, "denoise",
                                f"{cal['hsdp_gathered_blocks']:g} full blocks gathered at a time"))
        denoise += gathered
    if dit_swapped:
        denoise += dit_swapped
    workspace = 0.0
    if world > 1:
        workspace = cal.get(f"workspace_{mode}", 0.0) if mode != "hsdp" else 0.0
        if shard > 1:
            workspace += cal["workspace_hsdp"]
        terms.append(MemoryTerm("parallel workspace", workspace, "denoise",
                                "all-to-all / all-gather buffers the allocator keeps (fitted)"))

    # ---- VAE decode ---------------------------------------------------------------------
    decode, dec_note = _vae_decode_gib(req, sizes, family, spec, rank, cal)
    terms.append(MemoryTerm("VAE decode", decode, "decode", dec_note + " [measured on H200]"))
    slack = cal["decode_server_slack"] * decode
    terms.append(MemoryTerm("VAE decode allocator slack", slack, "decode",
                            "reserved beyond the isolated decode in a serving process (fitted to H200 after-job memory)"))
    decode_reserved = decode + slack
    decode_total = decode_reserved + dit_swapped + workspace   # the DiT stays on the GPU after denoising

    phases = {"resident": resident,
              "text": resident + (te if m.offload == "module" else 0.0) + 0.15,
              "denoise": resident + denoise + workspace + cal["decode_carry"] * decode_reserved,
              "decode": resident + decode_total}
    if family.image_input == "required":
        enc, enc_note = _vae_encode_gib(req, sizes, spec, cal)
        terms.append(MemoryTerm("VAE encode (I2V condition)", enc, "encode", enc_note))
        phases["encode"] = resident + enc + (te if m.offload == "module" else 0.0)
    peak_phase = max((k for k in phases if k != "resident"), key=lambda k: phases[k])
    torch_peak = phases[peak_phase]

    outside = cal["cuda_context_gib"] + (cal["nccl_gib"] if world > 1 else 0.0)
    terms.append(MemoryTerm("CUDA context and workspaces", cal["cuda_context_gib"], "outside",
                            "outside PyTorch's allocator"))
    if world > 1:
        terms.append(MemoryTerm("NCCL buffers", cal["nccl_gib"], "outside", f"world of {world} GPUs"))

    margin = 0.0
    fits: Optional[bool] = None
    headroom: Optional[float] = None
    if gpu is not None:
        margin = max(cal["margin_min_gib"], cal["margin_fraction"] * gpu.total_gib)
        headroom = gpu.available_gib - (torch_peak + outside) - margin
        fits = headroom >= 0
    return GpuPlan(rank=rank, gpu=gpu, terms=terms, phases=phases, peak_phase=peak_phase,
                   torch_peak_gib=torch_peak, outside_gib=outside, margin_gib=margin, fits=fits,
                   headroom_gib=headroom)


def _vae_decode_gib(req: RequestShape, sizes: ModelSizes, family: WanFamily, spec: LaunchSpec, rank: int,
                    cal: dict[str, float]) -> tuple[float, str]:
    """Decode working set on this rank (GiB, reserved, as measured in isolation) and how it was counted.

    Untiled: vae_decode_px x H x W (one latent frame at a time; flat in frames) + the video.
    Tiled: a tile's working set + all tiles kept for blending + the blended copies of the video;
    with patch parallel each rank decodes 1/pp of the tiles and rank 0 gathers and blends them.
    """
    px_coef = cal.get(f"vae_decode_px_{sizes.vae_kind}", cal["vae_decode_px_wan2.1"])
    w, h, f = req.width, req.height, req.frames
    video = 3 * f * h * w * 2 * req.batch / GIB                    # bf16 RGB video
    pp = spec.parallel.vae_patch if spec.parallel.world_size > 1 else 1
    tiled = spec.memory.vae_tiling or pp > 1
    if tiled and (w > TILE_PX or h > TILE_PX):
        work = cal["vae_decode_tile_gib"]
        tiles_all = video * cal["tile_overlap"]
        if pp > 1:
            held = tiles_all / pp + ((tiles_all + video * cal["video_copies_tiled"]) if rank == 0 else video)
            how = (f"tiled ({TILE_PX}px tiles), tiles spread over {pp} ranks"
                   + (", gathered and blended here" if rank == 0 else ", the blended video broadcast here"))
        else:
            held = tiles_all + video * cal["video_copies_tiled"]
            how = f"tiled ({TILE_PX}px tiles), all tiles kept for blending"
        return work + held, how + f"; video {video:.2f} GiB"
    work = px_coef * h * w * req.batch / GIB
    return work + video * cal["video_copies"], \
        f"untiled: one latent frame at a time at {w}x{h} (flat in frames); video {video:.2f} GiB " \
        "(--vae-use-tiling shrinks this)"


def _vae_encode_gib(req: RequestShape, sizes: ModelSizes, spec: LaunchSpec, cal: dict[str, float]) -> tuple[float, str]:
    px_coef = cal["vae_encode_px_wan2.1"]
    w, h, f = req.width, req.height, req.frames
    video = 3 * f * h * w * 2 * req.batch / GIB
    tiled = spec.memory.vae_tiling or (spec.parallel.vae_patch > 1 and spec.parallel.world_size > 1)
    if tiled and (w > TILE_PX or h > TILE_PX):
        return px_coef * TILE_PX * TILE_PX / GIB + 2 * video, "tiled encode of the image + black frames"
    return px_coef * h * w * req.batch / GIB + 2 * video, "untiled encode of the image + F-1 black frames"


def _host_ram(spec: LaunchSpec, sizes: ModelSizes, available: Optional[float]) -> dict[str, Any]:
    """Offload keeps pinned CPU copies: module offload of the swapped parts, layerwise of the DiT."""
    experts = _loaded_experts(spec, sizes)
    wfrac = CALIBRATION["fp8_weight_fraction"] if spec.memory.quantization == "fp8" else 1.0
    dit = sum(sizes.dit_gib(i) * wfrac for i in experts)
    ranks = spec.parallel.world_size
    if spec.memory.offload == "module":
        tp = spec.parallel.degree if spec.parallel.mode == "tensor" else 1
        need = (dit / tp + sizes.text_encoder_gib) * ranks
        what = "DiT experts and text encoder, per rank"
    else:
        need = dit
        what = "the DiT blocks"
    need += 4.0   # the server process itself (Python, CUDA host allocations)
    result: dict[str, Any] = {"needed_gib": round(need, 2), "what": what, "available_gib": None, "ok": None}
    if available == -1.0:
        try:
            import psutil  # lazy: planning for hypothetical GPUs works without it
            available = psutil.virtual_memory().available / GIB
        except Exception:
            available = None
            result["why_unknown"] = "psutil is not installed or could not read memory"
    if available is not None:
        result["available_gib"] = round(available, 2)
        result["ok"] = available >= need
    return result


def _general_notes(spec: LaunchSpec, req: RequestShape, family: WanFamily, notes: list[str]) -> None:
    if spec.memory.vae_slicing and req.batch <= 1:
        notes.append("--vae-use-slicing splits only a batch; at batch 1 it saves nothing")
    if spec.memory.quantization == "fp8":
        notes.append("FP8 for Wan2.2 is not validated upstream (feature table: quantization not supported); "
                     "the estimate assumes linear weights at 1 byte")
    if spec.parallel.world_size > 1 and spec.parallel.vae_patch > 1 and not spec.memory.vae_tiling:
        notes.append("VAE patch parallel turns VAE tiling on by itself (registry.py:475-480)")
    if spec.parallel.mode == "cfg" and not req.cfg:
        notes.append("CFG parallel with CFG off (guidance 1) leaves the second GPU idle: use ulysses instead")
