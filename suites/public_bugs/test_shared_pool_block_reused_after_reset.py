"""Graphs sharing one pool (`pool=a.pool()`, as runtimes capture every batch size into one) where
graph B reads a tensor graph A's capture allocated; the runtime drops that tensor and resets A,
and a later capture into the same pool (graph C) is handed the freed block (TensorRT-LLM #18022,
#16952; PyTorch's documented rule for shared pools). B's replay reads C's values: silently on
CUDA, and the replay is not refused on the emulated device either, since the block is of B's own
pool. `explain_against_eager` names B's op, its line and the cause ("pool memory overwritten by
another graph"). Fixed: the tensor B reads is kept alive as long as B."""

from __future__ import annotations

import torch

from harness.check.causes import POOL_OVERWRITTEN
from harness.check.explain_cuda import explain_against_eager


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


def test_a_shared_pool_block_reused_after_its_graph_was_reset_is_named():
    found = _explained(keep_the_scratch=False)
    assert found.diverged, found
    assert found.op == "aten.add.Tensor"
    assert "test_shared_pool_block_reused_after_reset.py" in found.where and "scratch" in found.where
    assert found.cause is not None and found.cause.kind == POOL_OVERWRITTEN, found.cause


def test_a_scratch_kept_as_long_as_its_reader_replays_as_eager():
    found = _explained(keep_the_scratch=True)
    assert not found.diverged, found
    assert found.replays_compared == 4
    assert SharedPool(keep_the_scratch=True).graphed().tolist() == [4.0] * 8
