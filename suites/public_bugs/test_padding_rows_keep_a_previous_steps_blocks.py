"""Padding rows of a decode graph that keep the block table of an earlier step (lmdeploy #4569,
"block_offsets padding 0": "kv cache would be polluted if block_offsets contain data from previous
step": https://github.com/InternLM/lmdeploy/pull/4569; padding dummies aliasing live state,
TensorRT-LLM #13278: https://github.com/NVIDIA/TensorRT-LLM/pull/13278). The runtime copies this
step's block offsets into the front of the captured table and leaves the padding rows as the last
step left them. A step of 4 requests gave row 3 block 5; that request finished, its block went to a
new request, and the next step of 3 runs in the graph for 4: the pad row writes its key into block 5,
over the new request's prompt token. CUDA writes there too: nothing is refused, and the request's
attention reads the pad row's garbage. `explain_against_eager` names the attention's read of the
cache, its line and the padding write it takes its values from. Fixed: the padding rows of the
table are reset to block 0, reserved for padding, before each replay."""

from __future__ import annotations

import pytest
import torch

from harness.check.causes import PADDING_ALIASES
from harness.check.explain_cuda import explain_against_eager

CAPTURED, BLOCKS, BLOCK_SIZE, HEAD = 4, 6, 2, 2
# (block, position) of each request's new token, step by step: the first step is full; then the
# request of block 5 finishes and a new one gets block 5 (its prompt token at position 0).
STEPS = (((1, 1), (2, 1), (3, 1), (5, 1)), ((1, 0), (2, 0), (5, 1)))


class Decode:
    def __init__(self, *, resets_padding: bool) -> None:
        self.resets_padding = resets_padding
        self.kv = torch.zeros(BLOCKS, BLOCK_SIZE, HEAD, device="cuda")  # block 0: padding's
        self.keys = torch.zeros(CAPTURED, HEAD, device="cuda")
        self.block_offsets = torch.zeros(CAPTURED, dtype=torch.long, device="cuda")
        self.positions = torch.zeros(CAPTURED, dtype=torch.long, device="cuda")
        self.out = torch.zeros(CAPTURED, HEAD, device="cuda")

    def body(self, keys: torch.Tensor, blocks: torch.Tensor, positions: torch.Tensor) -> None:
        self.kv[blocks, positions] = keys
        self.out[: keys.shape[0]].copy_(self.kv[blocks].sum(1))  # attention over each row's block

    @staticmethod
    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = STEPS[step]
        keys = torch.full((len(rows), HEAD), 10.0 * (step + 1), device="cuda")
        blocks = torch.tensor([b for b, _ in rows], device="cuda")
        return keys, blocks, torch.tensor([p for _, p in rows], device="cuda")

    def prefill_new_request(self) -> None:
        self.kv[5].zero_()
        self.kv[5, 0] = 7.0  # the new request's prompt token

    def graphed(self) -> torch.Tensor:
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            self.body(self.keys, self.block_offsets, self.positions)
        for step in range(len(STEPS)):
            if step == 1:
                self.prefill_new_request()
            keys, blocks, positions = self.batch(step)
            n = keys.shape[0]
            self.keys[:n].copy_(keys)
            self.keys[n:].fill_(-1000.0)  # the pad rows' activations: garbage
            self.block_offsets[:n].copy_(blocks)
            self.positions[:n].copy_(positions)
            self.positions[n:].zero_()
            if self.resets_padding:
                self.block_offsets[n:].zero_()
            graph.replay()
        torch.cuda.synchronize()
        return self.out[: len(STEPS[-1])]

    def eager(self) -> torch.Tensor:
        for step in range(len(STEPS)):
            if step == 1:
                self.prefill_new_request()
            self.body(*self.batch(step))
        return self.out[: len(STEPS[-1])]


def _explained(*, resets_padding: bool):
    return explain_against_eager(Decode(resets_padding=resets_padding).graphed,
                                 Decode(resets_padding=resets_padding).eager)


def test_the_pad_row_writes_into_the_block_of_a_new_request():
    graphed = Decode(resets_padding=False).graphed().tolist()
    eager = Decode(resets_padding=False).eager().tolist()
    assert eager[2] == [27.0, 27.0]  # prompt token 7 + this step's 20
    assert graphed[:2] == eager[:2] and graphed[2] == [-980.0, -980.0]


@pytest.mark.explains_against_eager
def test_the_stale_padding_row_is_named_where_the_new_request_reads_its_block():
    found = _explained(resets_padding=False)
    assert found.diverged, found
    assert found.op == "aten.index.Tensor", found
    assert "test_padding_rows_keep_a_previous_steps_blocks.py" in found.where, found
    assert "self.kv[blocks].sum(1)" in found.where, found
    assert found.graph == "graph 1, replay 2", found
    assert found.cause is not None and found.cause.kind == PADDING_ALIASES, found.cause
    assert "self.kv[blocks, positions] = keys" in found.cause.detail, found.cause


@pytest.mark.explains_against_eager
def test_padding_rows_reset_to_the_reserved_block_leave_live_blocks_alone():
    found = _explained(resets_padding=True)
    assert not found.diverged, found
    assert found.replays_compared == 2
    assert Decode(resets_padding=True).graphed().tolist() == Decode(resets_padding=True).eager().tolist()
