"""Scratch memory shared by the attention ops, grown by reallocation on demand.

Growth replaces `tensor` with a new, larger buffer. A graph captured before the growth still
reads and writes the old one: exactly the hazard that two-pass capture (warm every shape up,
then capture) exists to avoid, and that `growths` lets a test observe.
"""

from __future__ import annotations

import torch


class Workspace:
    def __init__(self, dtype: torch.dtype, device: torch.device | str = "cpu") -> None:
        self.dtype = dtype
        self.device = torch.device(device)
        self.tensor = torch.empty(0, dtype=dtype, device=self.device)
        self.growths = 0

    @property
    def capacity(self) -> int:
        return self.tensor.numel()

    def get(self, numel: int) -> torch.Tensor:
        """A flat view of the first `numel` elements; regrows (reallocates) when numel > capacity."""
        if numel < 0:
            raise ValueError(f"workspace request must be non-negative, got {numel}")
        if numel > self.capacity:
            # A normal tensor, even when grown under inference mode: an inference tensor would
            # refuse the in-place writes of a later call outside it (a model serves both).
            with torch.inference_mode(False):
                self.tensor = torch.empty(numel, dtype=self.dtype, device=self.device)
            self.growths += 1
        return self.tensor[:numel]
