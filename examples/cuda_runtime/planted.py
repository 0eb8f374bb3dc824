"""Two capture bugs planted into the runner, for its suite to show they are caught."""

from __future__ import annotations

import torch

from model_runner import ModelRunner


class RebindsInputs(ModelRunner):
    """Planted bug: the step's token ids are rebound instead of copied into the static buffer."""

    def run_model(self, input_ids, positions, is_prefill):
        if not is_prefill and input_ids.size(0) <= self.max_bs:
            # The replaced buffer stays alive (held elsewhere, as a runtime's old references do):
            # on a GPU a freed one would hand its address to the new buffer and hide the bug.
            self.replaced = [*getattr(self, "replaced", []), self.graph_vars["input_ids"]]
            self.graph_vars["input_ids"] = torch.zeros_like(self.graph_vars["input_ids"])
        return super().run_model(input_ids, positions, is_prefill)


class RegrowsWorkspace(ModelRunner):
    """Planted bug: the workspace is sized lazily, so a larger eager batch regrows it after capture.

    Each freed workspace is watched: a tensor of its size, filled with a sentinel, is made right after
    it is dropped. On a GPU the caching allocator hands the freed address to that tensor, and a graph
    still writing its scores there shows in the sentinel (the tokens alone may come out right: the
    graph writes its scratch before reading it)."""

    SENTINEL = 7.0

    def reserve(self) -> None:
        self.model.reserve_workspace(self.max_bs)
        self.sentinels: list[torch.Tensor] = []
        grow = self.model.reserve_workspace

        def reserve_and_watch(batch: int) -> None:
            size = self.model.workspace.numel()
            grow(batch)
            if self.model.workspace.numel() != size:
                self.sentinels.append(torch.full((size,), self.SENTINEL, device=self.model.workspace.device))

        self.model.reserve_workspace = reserve_and_watch

    def freed_memory_written(self) -> bool:
        return any(not bool((s == self.SENTINEL).all()) for s in self.sentinels)
