"""The kernel options a capture benchmark runs every engine with, as one value passed down."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KernelOptions:
    """`EngineConfig`'s kernel fields (None: choose for the device), the same for every engine of
    one measurement."""

    decode_kernel: str | None = None
    rope_kv_write: str | None = None
    decode_linear: str | None = None
    greedy_ranking: str | None = None
    pdl: bool | None = None

    def config_fields(self) -> dict[str, Any]:
        """The `EngineConfig` keyword arguments these options set."""
        return dataclasses.asdict(self)

    def with_pdl(self, pdl: bool | None) -> "KernelOptions":
        return dataclasses.replace(self, pdl=pdl)
