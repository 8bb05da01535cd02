"""The shape of one request, as the memory and speed estimates see it: frame size, frames, CFG, batch."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..models import WanFamily


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
