"""Which graph a decode batch replays, as graphs come and go: the engine answers per step from
routes it keeps for the graphs captured now, so a release or a new capture must change the answer
at once (a route kept past them would replay a released graph or miss a new one)."""

from __future__ import annotations

from harness.ops.metadata import SequenceSpan


def decode_spans(engine, lengths):
    bs = engine.kv_cache.block_size
    return tuple(SequenceSpan(seq_len=n, query_len=1,
                              block_table=tuple(engine.kv_cache.allocator.allocate(-(-n // bs))))
                 for n in lengths)


def test_routes_follow_release_and_recapture(make_engine):
    engine = make_engine(decode_graph_sizes=(4, 1))
    graphs = engine.decode_graphs
    engine.prepare_graphs()
    captured = graphs.runner.generation
    assert graphs.size_for(3) == 4 and graphs.size_for(1) == 1
    step = graphs.run(decode_spans(engine, (5, 9, 12)), (1, 2, 3))
    assert step is not None and str(step.key) == "decode[bs=4,greedy]"
    assert engine.stats.replays["decode[bs=4,greedy]"] == 1

    graphs.release()
    assert graphs.runner.generation > captured
    assert graphs.size_for(3) is None
    assert "no decode graph captured" in graphs.no_graph_reason(3)
    assert graphs.run(decode_spans(engine, (6,)), (4,)) is None
    assert engine.stats.fallbacks["decode batch of 1: no decode graph captured"] == 1

    graphs.warmup_and_capture()
    assert graphs.size_for(3) == 4
    step = graphs.run(decode_spans(engine, (7, 8)), (5, 6))
    assert step is not None and str(step.key) == "decode[bs=4,greedy]"
    assert engine.stats.replays["decode[bs=4,greedy]"] == 2


def test_a_batch_above_every_graph_is_counted_each_step(make_engine):
    engine = make_engine(decode_graph_sizes=(2,))
    engine.prepare_graphs()
    spans = decode_spans(engine, (5, 6, 7))
    for _ in range(3):
        assert engine.decode_graphs.run(spans, (1, 2, 3)) is None
    reason = "decode batch of 3 exceeds the largest decode graph (2)"
    assert engine.decode_graphs.no_graph_reason(3) == reason
    assert engine.stats.fallbacks[reason] == 3
