"""What the link between two GPUs changes in the ladder (planner/ladder.py): the one owner of the P2P policy.

CFG parallel exchanges one latent-sized prediction per step, while Ulysses, ring and tensor parallel
exchange activations in every layer. Without GPUDirect peer-to-peer access (GeForce cards lack it:
NVIDIA/nccl #1309, raylight #22, xDiT #526/#553) that exchange goes over PCIe through host memory and
may be slower than one GPU. So:

- P2P known absent (`p2p` False: NVML said so, or `plan --p2p no`): a configuration with that per-layer
  exchange is only a last resort, recommended when nothing without it fits (also when the request must
  shrink: `tiers`); CFG parallel first, then one GPU.
- Two GeForce cards with P2P unknown: they usually lack it, so CFG parallel comes first and one GPU
  without offload before Ulysses/TP, but Ulysses/TP still come before one GPU with offload (the order
  the measured costs give when P2P is there); the recommendation says P2P is unknown and how to check.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ..server.launch.spec import LaunchSpec
from .gpus import GpuInfo
from .recommendation import Rung

PER_LAYER_MODES = ("ulysses", "tensor", "ring")
NCCL_HANG = "if NCCL hangs, set NCCL_P2P_DISABLE=1"


def exchanges_every_layer(spec: LaunchSpec) -> bool:
    """Whether `spec`'s parallel mode moves activations between the GPUs in every layer."""
    return spec.parallel.mode in PER_LAYER_MODES


@dataclass(frozen=True)
class PeerLinks:
    """Two GPUs' peer-to-peer access as far as the planner knows it (`pair` False: not two GPUs)."""

    pair: bool
    p2p: Optional[bool]          # None: unknown
    geforce: bool                # every card is a GeForce
    some_geforce: bool

    @property
    def absent(self) -> bool:
        return self.pair and self.p2p is False

    @property
    def likely_absent(self) -> bool:
        return self.pair and self.p2p is None and self.geforce

    def notes(self, cfg: bool) -> list[str]:
        """What the plan says about the order it chose for these links."""
        if self.absent:
            if cfg:
                return ["two GPUs without peer-to-peer access: CFG parallel (one prediction exchanged per step), "
                        "then one GPU, come before Ulysses/tensor parallel, which exchange activations in every "
                        "layer over PCIe through host memory (often slower than one GPU) and are recommended only "
                        "when nothing else fits"]
            return ["two GPUs without peer-to-peer access and CFG off: one GPU comes before Ulysses/tensor "
                    "parallel, which exchange activations in every layer over PCIe and may be slower than one "
                    "GPU (recommended only when nothing else fits); CFG parallel needs CFG on (guidance > 1)"]
        if self.likely_absent:
            return ["peer-to-peer access between these two GeForce GPUs is unknown (GeForce cards usually lack "
                    "it): CFG parallel and one GPU without offload come before Ulysses/tensor parallel, which "
                    "still come before one GPU with offload; run `doctor` to check, and if it shows no P2P, plan "
                    "with --p2p no"]
        if self.pair and self.p2p is None and self.some_geforce:
            return ["peer-to-peer access between the GPUs is unknown; GeForce cards usually lack it, "
                    "which makes Ulysses/TP slow: run `doctor` to check"]
        return []

    def group(self, r: Rung) -> int:
        """`r`'s place in the order for these links (the ladder sorts stably by it after the speed costs)."""
        p, off = r.spec.parallel, r.spec.memory.offload
        if self.absent:
            return 2 if exchanges_every_layer(r.spec) else (0 if p.mode == "cfg" else 1)
        if self.likely_absent:
            if p.mode == "cfg":
                return 0
            if p.world_size == 1:
                return 1 if off == "none" else 3
            return 2
        return 0

    def warning(self, r: Rung) -> str:
        """What a rung with a per-layer exchange must say over these links ("" when nothing)."""
        if not exchanges_every_layer(r.spec):
            return ""
        if self.absent:
            return (f"{r.label} exchanges activations in every layer; without peer-to-peer access that goes "
                    f"through host memory and may be slower than one GPU ({NCCL_HANG})")
        if self.likely_absent:
            return (f"{r.label} exchanges activations in every layer; peer-to-peer access between these GeForce "
                    "GPUs is unknown and they usually lack it, which sends that exchange through host memory and "
                    "may make it slower than one GPU: run `doctor` to check, and if it shows no P2P, plan with "
                    f"--p2p no ({NCCL_HANG})")
        return ""

    def tiers(self, rungs: Sequence[Rung]) -> list[list[Rung]]:
        """The rungs in the order they may be chosen: without P2P, those with a per-layer exchange only after
        every other one (so a shrunk request too prefers the rungs without it)."""
        if not self.absent:
            return [list(rungs)]
        return [[r for r in rungs if not exchanges_every_layer(r.spec)],
                [r for r in rungs if exchanges_every_layer(r.spec)]]


def p2p_links(gpus: Sequence[GpuInfo], p2p: Optional[bool]) -> PeerLinks:
    """The links of `gpus` given what is known of their P2P access (`p2p`: None unknown)."""
    return PeerLinks(pair=len(gpus) == 2, p2p=p2p, geforce=bool(gpus) and all(g.is_geforce for g in gpus),
                     some_geforce=any(g.is_geforce for g in gpus))
