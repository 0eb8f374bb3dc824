"""A small runtime written only against `torch.cuda`, shaped like nano-vllm's model runner, for
`explain_against_eager` and `harness explain FILE::FUNCTION` to be tried on as on code the project
did not write: a paged KV cache, one decode graph for the largest batch, smaller batches padded to
it, and static graph buffers sized for the largest batch and the longest block table.

The block table differs in shape by design: eager passes [batch, blocks the batch's longest
sequence holds] (nano-vllm's `prepare_block_tables`), the graph reads its static
[max_bs, max_blocks] buffer with zeros past each row. Padding rows get slot -1, which the model
sends to a sink slot no sequence reads. `pad_slot` plants the padding bug: padding rows written to
that slot instead, a live one.

`run_ranked` and `run_checks_free_memory` pad their block tables to the graph's width on the host
(as vLLM does), so that only what they check differs from `run`.

The entry points take `graphed` (the shape `harness explain FILE::FUNCTION` calls): `run` is the
correct runtime, `run_padding_bug` the planted one, `run_ranked` ranks each step's logits with the
harness's own `logits_to_steps`, `run_checks_free_memory` checks the free memory its KV cache was sized from.
"""

from __future__ import annotations

import math

import torch

VOCAB, HIDDEN, BLOCK, MAX_BLOCKS, NUM_BLOCKS, MAX_BS = 64, 32, 4, 8, 32, 4
SINK = NUM_BLOCKS * BLOCK  # the padding rows' slot, past every block


class PagedRunner:
    def __init__(self, graphed: bool, *, pad_slot: int = -1, num_blocks: int = NUM_BLOCKS) -> None:
        generator = torch.Generator().manual_seed(0)

        def weight(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=generator) / math.sqrt(shape[0])).to("cuda")

        self.embed = weight(VOCAB, HIDDEN)
        self.wq, self.wk, self.wv = weight(HIDDEN, HIDDEN), weight(HIDDEN, HIDDEN), weight(HIDDEN, HIDDEN)
        self.lm_head = weight(HIDDEN, VOCAB)
        self.sink = num_blocks * BLOCK
        self.k_cache = torch.zeros(self.sink + 1, HIDDEN, device="cuda")
        self.v_cache = torch.zeros(self.sink + 1, HIDDEN, device="cuda")
        self.graphed, self.pad_slot = graphed, pad_slot
        if graphed:
            self.static = dict(input_ids=torch.zeros(MAX_BS, dtype=torch.int64, device="cuda"),
                               slot_mapping=torch.full((MAX_BS,), -1, dtype=torch.int32, device="cuda"),
                               context_lens=torch.ones(MAX_BS, dtype=torch.int32, device="cuda"),
                               block_tables=torch.zeros(MAX_BS, MAX_BLOCKS, dtype=torch.int32, device="cuda"))
            self.forward(**self.static)  # warmup
            self.k_cache.zero_()
            self.v_cache.zero_()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits = self.forward(**self.static)

    def forward(self, input_ids, slot_mapping, context_lens, block_tables) -> torch.Tensor:
        x = self.embed[input_ids]
        q, k, v = x @ self.wq, x @ self.wk, x @ self.wv
        slots = torch.where(slot_mapping < 0, self.sink, slot_mapping).long()
        self.k_cache.index_copy_(0, slots, k)
        self.v_cache.index_copy_(0, slots, v)
        offsets = torch.arange(BLOCK, device=input_ids.device)
        key_slots = (block_tables.long()[:, :, None] * BLOCK + offsets).flatten(1)
        keys, values = self.k_cache[key_slots], self.v_cache[key_slots]
        scores = (keys @ q[:, :, None]).squeeze(-1) / math.sqrt(HIDDEN)
        visible = torch.arange(key_slots.size(1), device=input_ids.device)[None, :] < context_lens[:, None]
        weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        attended = (weights[:, None, :] @ values).squeeze(1)
        return (x + attended) @ self.lm_head

    def step(self, input_ids, slot_mapping, context_lens, block_tables) -> torch.Tensor:
        """Logits of one decode step's real rows."""
        bs = input_ids.size(0)
        if not self.graphed:
            return self.forward(input_ids, slot_mapping, context_lens, block_tables)
        static = self.static
        static["input_ids"][:bs] = input_ids
        static["slot_mapping"].fill_(self.pad_slot)
        static["slot_mapping"][:bs] = slot_mapping
        static["context_lens"].fill_(1)
        static["context_lens"][:bs] = context_lens
        static["block_tables"][:bs, :block_tables.size(1)] = block_tables
        self.graph.replay()
        return self.logits[:bs]


def decode(runner: PagedRunner, steps: int = 3, batch: int = 3, rank=None, wide: bool = False) -> list:
    """Greedy decode of `batch` sequences (sequence i owns blocks 2i and 2i+1) for `steps` steps
    from position 0; `rank(logits)` reads each step's logits (by default their argmax). `wide`:
    block tables padded to `MAX_BLOCKS` on the host (as vLLM's are), the graph's width."""
    tokens = torch.arange(1, batch + 1, device="cuda")
    width = MAX_BLOCKS if wide else 2
    block_tables = torch.tensor([[2 * i, 2 * i + 1] + [0] * (width - 2) for i in range(batch)],
                                dtype=torch.int32, device="cuda")
    out = []
    for position in range(steps):
        slots = (block_tables[:, position // BLOCK].long() * BLOCK + position % BLOCK).int()
        lens = torch.full((batch,), position + 1, dtype=torch.int32, device="cuda")
        logits = runner.step(tokens, slots, lens, block_tables)
        out.append(rank(logits) if rank is not None else logits.argmax(-1).tolist())
        tokens = logits.argmax(-1)
    return out


def run(graphed: bool) -> list:
    return decode(PagedRunner(graphed))


def run_padding_bug(graphed: bool) -> list:
    """Padding rows written to slot 0, which sequence 0's first token holds."""
    return decode(PagedRunner(graphed, pad_slot=0))


def run_ranked(graphed: bool) -> list:
    from harness.ranking import logits_to_steps

    return decode(PagedRunner(graphed), rank=lambda logits: logits_to_steps(logits, [2] * logits.shape[0], "user"),
                  wide=True)


def run_checks_free_memory(graphed: bool) -> list:
    """Checks, as a runtime that sized its KV cache from what was free must, that decoding keeps
    no device memory (`memory_allocated()`, and `mem_get_info()`'s free bytes; 64 KiB allowed)."""
    runner = PagedRunner(graphed)
    # The first matmul on a stream leaves cuBLAS's workspace allocated for the process's life: a
    # runtime that profiles free memory runs one first, as runtimes do with a dummy step.
    warm = torch.ones(8, 8, device="cuda")
    warm @ warm
    del warm
    allocated, (free, _) = torch.cuda.memory_allocated(), torch.cuda.mem_get_info()
    out = decode(runner, wide=True)
    kept = max(torch.cuda.memory_allocated() - allocated, free - torch.cuda.mem_get_info()[0])
    if kept > 2 ** 16:
        raise RuntimeError(f"decoding kept {kept} bytes of device memory: the KV cache sized from "
                           f"the free memory has no room left")
    return out
