"""i. Padding: a decode batch of 3 on a size-4 graph; the dummy row writes only into the pad sink."""

from __future__ import annotations

import torch

from fixtures.models import mixed_requests
from harness.check import compare_generations
from harness.ops.metadata import SequenceSpan
from harness.runtime import Engine

SENTINEL = 7.0


def test_a_batch_of_three_on_a_graph_of_four_matches_eager(make_engine, device_reference_llama, overlap):
    from fixtures.models import TINY_ENGINE_CONFIG

    requests = mixed_requests(prompt_lens=(5, 9, 14), max_new_tokens=(6, 6, 6), logprobs=2)
    eager = Engine(device_reference_llama, TINY_ENGINE_CONFIG).generate(requests)
    engine = make_engine(decode_graph_sizes=(4,), overlap=overlap)
    generations = engine.generate(requests)
    comparison = compare_generations(eager, generations)
    assert comparison.ok, str(comparison)
    assert {s.producer for g in generations for s in g.steps[1:]} == {"decode[bs=4,greedy]"}
    # Five decode steps, and with overlap the extra one whose tokens are dropped.
    assert engine.stats.decode_batch_sizes() == [3] * (6 if overlap else 5)


def test_the_dummy_row_writes_nothing_into_live_blocks(make_engine):
    engine = make_engine(decode_graph_sizes=(4,))
    engine.prepare_graphs()
    cache = engine.kv_cache
    bs = cache.block_size
    seq_lens = (5, 17, 30)
    spans = tuple(SequenceSpan(seq_len=n, query_len=1, block_table=tuple(cache.allocator.allocate(-(-n // bs))))
                  for n in seq_lens)
    cache.tensor.fill_(SENTINEL)
    step = engine.decode_graphs.run(spans, (11, 12, 13))
    assert step is not None and str(step.key) == "decode[bs=4,greedy]" and step.logits.shape[0] == 3
    engine.backend.synchronize()
    # Slots (over layers, K/V, heads) that the replay wrote.
    written = (cache.tensor != SENTINEL).any(-1).any(-1).any(1).any(0).flatten()  # [(blocks + 1) * bs]
    new_slots = {span.block_table[(span.seq_len - 1) // bs] * bs + (span.seq_len - 1) % bs for span in spans}
    pad_sink = set(range(cache.pad_slot, cache.pad_slot + bs))
    wrote = set(torch.nonzero(written).flatten().tolist())
    assert new_slots <= wrote  # each live sequence wrote its new token
    stray = sorted(wrote - new_slots - pad_sink)
    assert not stray and wrote & pad_sink, (
        f"the dummy row wrote KV slots {stray} of live blocks and {len(wrote & pad_sink)} slots of the "
        f"pad sink; it must write only the pad sink (slots {cache.pad_slot}..{cache.pad_slot + bs - 1})")
