"""Emulator-only behaviour: what it rejects that CUDA would break on, its poison values, its pool
arena, and allocation-free replay."""

from __future__ import annotations

import math

import pytest
import torch

from harness.graphs import CaptureError
from harness.graphs.emulator.pool import PoolArena, is_poisoned, poison_value


def test_out_of_the_wrong_size_is_rejected(emulated):
    x = torch.ones(4)
    out = torch.empty(3)
    with pytest.raises(CaptureError, match=r"out= argument 'out' from \(3,\) to \(4,\)"):
        emulated.capture(lambda: torch.add(x, 1, out=out))


def test_out_of_the_right_size_is_recorded(emulated):
    x = torch.ones(4)
    out = torch.zeros(4)
    graph = emulated.capture(lambda: torch.add(x, 1, out=out))
    assert graph.output is out and not out.any()
    graph.replay()
    assert torch.equal(out, torch.full((4,), 2.0))


def test_resize_of_pool_memory_is_rejected(emulated):
    x = torch.ones(4)
    with pytest.raises(CaptureError, match="resize_"):
        emulated.capture(lambda: (x + 1).resize_(8))


def test_shape_errors_surface_at_capture(emulated):
    a, b = torch.ones(2, 3), torch.ones(4, 5)
    with pytest.raises(RuntimeError, match=r"\[2, 3\]"):
        emulated.capture(lambda: a @ b)


@pytest.mark.parametrize("dtype, expected", [
    pytest.param(torch.float32, math.nan, id="float32"),
    pytest.param(torch.bfloat16, math.nan, id="bfloat16"),
    pytest.param(torch.int64, -(2**63), id="int64"),
    pytest.param(torch.int32, -(2**31), id="int32"),
    pytest.param(torch.uint8, 255, id="uint8"),
    pytest.param(torch.bool, True, id="bool")])
def test_poison_values(emulated, dtype, expected):
    value = poison_value(dtype)
    assert (math.isnan(value) and math.isnan(expected)) or value == expected
    x = torch.zeros(3, dtype=dtype)
    graph = emulated.capture(lambda: torch.zeros_like(x) | x if dtype == torch.bool else x + 0)
    assert is_poisoned(graph.output)
    graph.replay()
    assert not is_poisoned(graph.output)


def test_replay_allocates_no_pool_memory_and_skips_views(emulated):
    x = torch.randn(4, 8)
    w = torch.randn(8, 8)

    def fn():
        h = (x @ w).view(4, 2, 4).transpose(0, 1)
        scratch = torch.empty(4, 8)
        return torch.softmax(h.float(), -1), scratch

    graph = emulated.capture(fn)
    arena: PoolArena = graph.pool
    before = (arena.num_segments, arena.live_blocks())
    graph.replay()
    graph.replay()
    assert (arena.num_segments, arena.live_blocks()) == before
    assert graph.num_ops == 2  # mm and softmax: views, empty and a same-dtype cast need no replay
    expected = torch.softmax((x @ w).view(4, 2, 4).transpose(0, 1).float(), -1)
    assert torch.equal(graph.output[0], expected)


def test_the_recording_does_not_keep_intermediates_alive(emulated):
    x = torch.ones(256)

    def fn():
        return ((x + 1) * 2 + 3) * 4

    graph = emulated.capture(fn)
    assert graph.pool.live_blocks() == 1  # only the output; the two intermediates are free


def test_pool_from_another_backend_is_refused(emulated):
    with pytest.raises(TypeError, match="pool must be"):
        emulated.capture(lambda: None, pool=("cuda", 1))


def test_pre_existing_graph_output_used_as_input(emulated):
    x = torch.ones(4)
    first = emulated.capture(lambda: x * 2)
    second = emulated.capture(lambda: first.output + 1)
    x.fill_(3.0)
    first.replay()
    second.replay()
    assert torch.equal(second.output, torch.full((4,), 7.0))


def test_arena_best_fit_picks_the_smallest_gap():
    arena = PoolArena(torch.device("cpu"), segment_bytes=8192)
    # Blocks at 0, 2048, 3072, 3584 and 4096; keeping three frees a 1024-byte hole at 2048 and
    # a 512-byte one at 3584, and the tail from 4608 is free too.
    s0, s1, s2, s3, s4 = (arena.allocate(n)[0] for n in (2048, 1024, 512, 512, 512))
    del s1, s3  # s0, s2 and s4 stay alive until the end of the test
    _, block = arena.allocate(512)
    assert block.offset == 3584  # the tightest hole, not the first that fits
    assert arena.num_segments == 1
    del s0, s2, s4


def test_pool_owns_its_graph_outputs_only(emulated):
    x = torch.ones(4)
    first = emulated.capture(lambda: x + 1)
    second = emulated.capture(lambda: x + 2)
    assert first.pool.owns(first.output) and first.pool.owns(first.output[1:])
    assert not first.pool.owns(second.output) and not first.pool.owns(x)
