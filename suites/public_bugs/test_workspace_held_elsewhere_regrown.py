"""The regrown workspace of TensorRT-LLM #16319 and the rebound buffers of SGLang #4961 in the
forms runtimes hold them: in a dict or a list attribute, captured by a closure, registered as a
module buffer and later reassigned, grown with `torch.empty` rebinding, `resize_()`,
`UntypedStorage.resize_()` or `set_()`. Whatever holds the tensor, the graph keeps the address it
had at capture; the harness refuses the next replay, naming the capture's line. Fixed: the
workspace is sized for its largest use before capture and each step copies into a slice of it."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import FreedMemoryError

LARGEST = 1 << 10


class Holders:
    """One workspace reachable four ways; `grow` changes it as a runtime does for a larger batch."""

    def __init__(self, holder: str) -> None:
        self.holder = holder
        self.module = torch.nn.Module()
        self.module.register_buffer("workspace", torch.zeros(8, device="cuda"))
        self.by_stream = {0: torch.zeros(8, device="cuda")}
        self.slots = [torch.zeros(8, device="cuda")]
        closed_over = torch.zeros(8, device="cuda")
        self.from_closure = lambda: closed_over

    def get(self) -> torch.Tensor:
        if self.holder == "module buffer":
            return self.module.workspace
        if self.holder == "dict":
            return self.by_stream[0]
        if self.holder == "list":
            return self.slots[0]
        return self.from_closure()

    def rebind(self, new: torch.Tensor) -> None:
        if self.holder == "module buffer":
            self.module.workspace = new
        elif self.holder == "dict":
            self.by_stream[0] = new
        elif self.holder == "list":
            self.slots[0] = new
        else:
            self.from_closure = lambda: new


class Step:
    def __init__(self, holder: str, *, sized_for_largest: bool = False) -> None:
        self.holders = Holders(holder)
        if sized_for_largest:
            self.holders.rebind(torch.zeros(LARGEST, device="cuda"))
        self.x = torch.ones(8, device="cuda")
        self.out = torch.zeros(8, device="cuda")
        self.graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph):
            self.body()

    def body(self) -> None:
        workspace = self.holders.get()
        workspace[:8].copy_(self.x * 2)
        self.out.copy_(workspace[:8] + 1)

    def grow(self, how: str) -> None:
        workspace = self.holders.get()
        if how == "torch.empty rebinding":
            self.holders.rebind(torch.empty(LARGEST, device="cuda"))
        elif how == "resize_":
            workspace.resize_(LARGEST)
        elif how == "untyped_storage().resize_":
            workspace.untyped_storage().resize_(LARGEST * workspace.element_size())
        else:
            workspace.set_(torch.zeros(LARGEST, device="cuda").untyped_storage())


HOLDERS = ("module buffer", "dict", "list", "closure")
GROWTHS = ("torch.empty rebinding", "resize_", "untyped_storage().resize_", "set_")


@pytest.mark.parametrize("how", GROWTHS)
@pytest.mark.parametrize("holder", HOLDERS)
def test_a_workspace_regrown_after_capture_is_refused_whatever_holds_it(holder, how):
    step = Step(holder)
    step.graph.replay()
    step.grow(how)
    taken = torch.full((8,), 9.0, device="cuda")  # the allocator hands the old memory on
    with pytest.raises(FreedMemoryError, match=r"replay\(\) of a graph whose .*"
                       r"test_workspace_held_elsewhere_regrown.py:\d+: +workspace\[:8\]\.copy_"):
        step.graph.replay()
    del taken


@pytest.mark.parametrize("holder", HOLDERS)
def test_a_workspace_sized_before_capture_takes_new_rows_through_copy_into_a_slice(holder):
    step = Step(holder, sized_for_largest=True)
    step.holders.get()[8:16].copy_(torch.ones(8, device="cuda"))  # a larger batch's rows, same memory
    step.x.copy_(torch.full((8,), 3.0, device="cuda"))
    step.graph.replay()
    assert step.out.tolist() == [7.0] * 8
