"""Graphs sharing one pool (`pool=a.pool()`, as runtimes capture every batch size into one) where
graph B reads a tensor graph A's capture allocated; the runtime drops that tensor and resets A,
and a later capture into the same pool (graph C) is handed the freed block (TensorRT-LLM #18022,
#16952; PyTorch's documented rule for shared pools). B's replay reads C's values: silently on
CUDA; the emulated device and the graph sanitizer refuse it, naming the tensor, B's line and C's
allocation (harness/graphs/emulator/shared_blocks.py), and `explain_against_eager` reports that
refusal. Fixed: the tensor B reads is kept alive as long as B. Correct too: the tensor dropped, but
the graphs replayed in capture order, so A rewrites it before B reads it each step (vLLM's
piecewise outputs, kept as weak references)."""

from __future__ import annotations

import pytest
import torch

from harness.check.explain_cuda import explain_against_eager
from harness.graphs import FreedMemoryError

OVERWRITTEN = "reads pool memory overwritten by another graph"


def produce(x: torch.Tensor, held: dict) -> None:
    held["scratch"] = x * 3


def consume(held: dict, out: torch.Tensor) -> None:
    out.copy_(held["scratch"] + 1)


def other_batch(x: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(x * 100)


class SharedPool:
    def __init__(self, *, keep_the_scratch: bool) -> None:
        self.keep = keep_the_scratch
        self.x = torch.ones(8, device="cuda")
        self.out, self.other_out = torch.zeros(8, device="cuda"), torch.zeros(8, device="cuda")
        self.held: dict[str, torch.Tensor] = {}

    def graphed(self) -> torch.Tensor:
        torch.cuda.synchronize()
        first = torch.cuda.CUDAGraph()
        with torch.cuda.graph(first):
            produce(self.x, self.held)
        second = torch.cuda.CUDAGraph()
        with torch.cuda.graph(second, pool=first.pool()):
            consume(self.held, self.out)
        first.replay()
        second.replay()
        if not self.keep:
            del self.held["scratch"]
        first.reset()
        third = torch.cuda.CUDAGraph()
        with torch.cuda.graph(third, pool=second.pool()):
            other_batch(self.x, self.other_out)
        third.replay()
        second.replay()
        return self.out

    def eager(self) -> torch.Tensor:
        produce(self.x, self.held)
        consume(self.held, self.out)
        other_batch(self.x, self.other_out)
        consume(self.held, self.out)
        return self.out


def _explained(*, keep_the_scratch: bool):
    return explain_against_eager(SharedPool(keep_the_scratch=keep_the_scratch).graphed,
                                 SharedPool(keep_the_scratch=keep_the_scratch).eager)


@pytest.mark.strict_races
def test_a_shared_pool_block_reused_after_its_graph_was_reset_is_refused_at_replay():
    with pytest.raises(FreedMemoryError, match=OVERWRITTEN) as caught:
        SharedPool(keep_the_scratch=False).graphed()
    message = str(caught.value)
    assert 'reset.py:' in message and 'out.copy_(held["scratch"] + 1)' in message  # B's read
    assert "out.copy_(x * 100)" in message  # C's allocation over the scratch


@pytest.mark.strict_races
@pytest.mark.explains_against_eager
def test_explain_reports_the_refusal_with_the_replay_line():
    found = _explained(keep_the_scratch=False)
    assert not found.diverged, found  # refused before any op could depart from eager
    assert OVERWRITTEN in found.raised and "second.replay()" in found.raised, found


@pytest.mark.explains_against_eager
def test_a_scratch_kept_as_long_as_its_reader_replays_as_eager():
    found = _explained(keep_the_scratch=True)
    assert not found.diverged, found
    assert found.replays_compared == 4
    assert SharedPool(keep_the_scratch=True).graphed().tolist() == [4.0] * 8


def replayed_in_order(order: tuple[str, ...], steps: int = 3) -> list[list[float]]:
    """The scratch dropped once the capture that reads it is done (no tensor holds it), a third
    graph captured into the pool over its bytes, then `steps` steps of replays in `order`."""
    x = torch.ones(8, device="cuda")
    out, other_out = torch.zeros(8, device="cuda"), torch.zeros(8, device="cuda")
    held: dict[str, torch.Tensor] = {}
    torch.cuda.synchronize()
    graphs = {"first": torch.cuda.CUDAGraph(), "second": torch.cuda.CUDAGraph(),
              "third": torch.cuda.CUDAGraph()}
    with torch.cuda.graph(graphs["first"]):
        produce(x, held)
    with torch.cuda.graph(graphs["second"], pool=graphs["first"].pool()):
        consume(held, out)
    del held["scratch"]
    with torch.cuda.graph(graphs["third"], pool=graphs["first"].pool()):
        other_batch(x, other_out)
    results = []
    for step in range(steps):
        x.fill_(step + 1)
        for name in order:
            graphs[name].replay()
        results.append(out.tolist())
    return results


def test_graphs_sharing_a_pool_replayed_in_capture_order_read_what_the_owner_wrote():
    assert replayed_in_order(("first", "second", "third")) == [[4.0] * 8, [7.0] * 8, [10.0] * 8]


@pytest.mark.strict_races
def test_a_reader_replayed_after_the_graph_handed_its_bytes_is_refused():
    with pytest.raises(FreedMemoryError, match=OVERWRITTEN):
        replayed_in_order(("first", "third", "second"))
