"""h. Strict mode: a metadata tensor rebound between capture and replay raises, naming its path."""

from __future__ import annotations

import pytest

from harness.check import compare_generations
from harness.runtime.decode.runner import StaleGraphBufferError


def test_strict_mode_raises_on_a_rebound_metadata_tensor(make_engine, decode_requests):
    engine = make_engine(strict_graph_buffers=True)
    engine.prepare_graphs()
    old = engine.metadata.block_tables.data_ptr()
    engine.metadata.block_tables = engine.metadata.block_tables.clone()
    new = engine.metadata.block_tables.data_ptr()
    with pytest.raises(StaleGraphBufferError) as raised:
        engine.generate(decode_requests)
    message = str(raised.value)
    assert "decode graph decode[bs=8,greedy] would replay against moved tensors" in message
    assert f"metadata.block_tables: data pointer changed from {old:#x} to {new:#x}" in message


def test_strict_mode_passes_when_nothing_moved(make_engine, decode_requests, eager_decode, overlap):
    engine = make_engine(strict_graph_buffers=True, overlap=overlap)
    comparison = compare_generations(eager_decode, engine.generate(decode_requests))
    assert comparison.ok, str(comparison)


def test_without_strict_mode_the_same_rebinding_diverges_silently(make_engine, decode_requests, eager_decode):
    engine = make_engine()
    engine.prepare_graphs()
    keep_alive = engine.metadata.block_tables  # the graphs' copy stays valid memory, only stale
    engine.metadata.block_tables = keep_alive.clone()
    comparison = compare_generations(eager_decode, engine.generate(decode_requests))
    assert not comparison.ok


def test_replay_refuses_a_batch_prepared_for_another_shape(make_engine):
    engine = make_engine()
    engine.prepare_graphs()
    runner = engine.decode_graphs.runner
    engine.prepare_padded((), num_tokens=3, num_seqs=3)
    with pytest.raises(ValueError, match=r"captured for 4 sequences and 4 token rows, but the metadata is "
                                         r"prepared for 3 sequences and 3 token rows"):
        runner.replay(runner.key_for(3))
