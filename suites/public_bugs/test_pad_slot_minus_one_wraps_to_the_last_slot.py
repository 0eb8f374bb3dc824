"""Padding rows of a decode graph whose slot id is `PADDING_SLOT_ID = -1`, written into the KV
cache by plain tensor indexing (vLLM #43810, "extract_hidden_states CUDA graph padding writes
PADDING_SLOT_ID=-1 into last hidden-state KV slot": https://github.com/vllm-project/vllm/issues/43810;
the fix, #43869: https://github.com/vllm-project/vllm/pull/43869; #13922, `reshape_and_cache` with
`slot_mapping` shorter than the padded keys: https://github.com/vllm-project/vllm/pull/13922).
Python indexing wraps -1 to the last slot, so every replay of a padded batch writes the pad row's
key over the last slot of the cache, which a live request owns. CUDA's indexing kernel wraps -1 the
same way: nothing is refused, and the request's attention reads the pad row's garbage. The eager
step (3 rows, no padding) never writes there: `explain_against_eager` names the attention's read
of the cache, its line, and why (padding rows must touch only memory that no real row reads).
Fixed: the write skips negative slots (the cache kernel's `if (slot_idx < 0) return;`), here by
sending them to a sink row past the cache that no request reads."""

from __future__ import annotations

import pytest
import torch

from harness.check.causes import PADDING_ALIASES
from harness.check.explain_cuda import explain_against_eager

NUM_SLOTS, CAPTURED, REAL, HEAD = 8, 4, 3, 2
PADDING_SLOT_ID = -1
# Each real request's slots: request 2 cached its earlier token in the last slot.
SLOTS_OF = ((0, 1), (2, 3), (6, 7))
NEW_SLOTS = (1, 3, 6)  # where this step's keys go


class Decode:
    def __init__(self, *, skips_negative_slots: bool) -> None:
        self.skips = skips_negative_slots
        # one sink row past the cache: the fixed write sends padding there
        self.storage = torch.zeros(NUM_SLOTS + 1, HEAD, device="cuda")
        self.kv = self.storage[:NUM_SLOTS]
        self.kv[7] = 42.0  # request 2's earlier token
        self.keys = torch.zeros(CAPTURED, HEAD, device="cuda")
        self.slot_mapping = torch.full((CAPTURED,), PADDING_SLOT_ID, dtype=torch.long, device="cuda")
        self.reads = torch.tensor(SLOTS_OF, device="cuda")
        self.out = torch.zeros(REAL, HEAD, device="cuda")

    def body(self, keys: torch.Tensor, slots: torch.Tensor) -> None:
        if self.skips:
            self.storage[torch.where(slots >= 0, slots, NUM_SLOTS)] = keys
        else:
            self.kv[slots] = keys  # basic_cache: -1 is the last slot to Python indexing
        self.out.copy_(self.kv[self.reads].sum(1))  # each request attends over its slots

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        keys = torch.arange(1.0, REAL * HEAD + 1, device="cuda").reshape(REAL, HEAD)
        return keys, torch.tensor(NEW_SLOTS, device="cuda")

    def graphed(self) -> torch.Tensor:
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            self.body(self.keys, self.slot_mapping)
        keys, slots = self.batch()
        self.keys[:REAL].copy_(keys)
        self.keys[REAL:].fill_(-1000.0)  # what the pad row's activations happen to hold
        self.slot_mapping[:REAL].copy_(slots)
        self.slot_mapping[REAL:].fill_(PADDING_SLOT_ID)
        self.kv[7] = 42.0  # the capture ran nothing: the cache is as the request left it
        graph.replay()
        torch.cuda.synchronize()
        return self.out

    def eager(self) -> torch.Tensor:
        self.body(*self.batch())
        return self.out


def _explained(*, skips_negative_slots: bool):
    return explain_against_eager(Decode(skips_negative_slots=skips_negative_slots).graphed,
                                 Decode(skips_negative_slots=skips_negative_slots).eager)


def test_the_pad_row_overwrites_the_last_slot_of_a_live_request():
    graphed, eager = Decode(skips_negative_slots=False), Decode(skips_negative_slots=False)
    out = graphed.graphed().tolist()
    assert eager.eager().tolist() == [[1.0, 2.0], [3.0, 4.0], [47.0, 48.0]]
    assert out[2] == [-995.0, -994.0]  # request 2 reads the pad row's -1000 in its last slot
    assert graphed.kv[7].tolist() == [-1000.0, -1000.0]


@pytest.mark.explains_against_eager
def test_the_wrapped_padding_write_is_named_where_the_request_reads_it():
    found = _explained(skips_negative_slots=False)
    assert found.diverged, found
    assert found.op == "aten.index.Tensor", found
    assert "test_pad_slot_minus_one_wraps_to_the_last_slot.py" in found.where, found
    assert "self.kv[self.reads]" in found.where, found
    assert found.cause is not None and found.cause.kind == PADDING_ALIASES, found.cause
    assert "aten.index_put_.default" in found.cause.detail, found.cause
    assert "self.kv[slots] = keys" in found.cause.detail, found.cause  # the write, by its line


@pytest.mark.explains_against_eager
def test_negative_slots_sent_to_a_sink_leave_the_cache_as_eager_writes_it():
    found = _explained(skips_negative_slots=True)
    assert not found.diverged, found
    assert found.replays_compared == 1 and found.ops_compared >= 3
    graphed = Decode(skips_negative_slots=True)
    assert graphed.graphed().tolist() == [[1.0, 2.0], [3.0, 4.0], [47.0, 48.0]]
    assert graphed.kv[7].tolist() == [42.0, 42.0]
