"""A captured tensor whose storage changes in place after capture: the attention workspace grown
with `resize_()` for a larger batch (TensorRT-LLM #16319), weights reloaded by `.data = new` or
`set_()` (vLLM #40390, SGLang #4961). The graph keeps the old address; the harness refuses the next
replay naming the old and new address and the capture's line. Fixed: size the workspace for its
largest use before capture, copy reloaded weights into the captured tensors."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import FreedMemoryError


class Runner:
    def __init__(self) -> None:
        self.weight = torch.full((8,), 2.0, device="cuda")
        self.workspace = torch.zeros(8, device="cuda")
        self.x = torch.ones(8, device="cuda")
        self.out = torch.zeros(8, device="cuda")
        self.graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph):
            self.workspace.copy_(self.x * self.weight)
            self.out.copy_(self.workspace + 1)

    def step(self, x: torch.Tensor) -> torch.Tensor:
        self.x.copy_(x)
        self.graph.replay()
        return self.out.clone()


@pytest.mark.parametrize("change", ["resize_", "set_", "data"])
def test_a_storage_changed_under_the_captured_tensor_is_refused(change):
    runner = Runner()
    moved = runner.workspace if change == "resize_" else runner.weight
    before = moved.data_ptr()
    old = moved.data  # another tensor on the old storage keeps it alive
    if change == "resize_":
        runner.workspace.resize_(1 << 14)  # a larger batch needs more scratch
    elif change == "set_":
        runner.weight.set_(torch.full((8,), 3.0, device="cuda"))
    else:
        runner.weight.data = torch.full((8,), 3.0, device="cuda")
    with pytest.raises(FreedMemoryError, match=rf"{before:#x}.*{moved.data_ptr():#x}") as caught:
        runner.step(torch.ones(8, device="cuda"))
    assert "test_workspace_regrown_in_place.py" in str(caught.value)


def test_sized_before_capture_and_copied_into_it_replays_the_new_values():
    runner = Runner()
    runner.weight.copy_(torch.full((8,), 3.0, device="cuda"))
    assert torch.equal(runner.step(torch.ones(8, device="cuda")), torch.full((8,), 4.0, device="cuda"))
