"""The device memory a CUDA graph's random ops cost, per torch build. From torch 2.14 each
(generator state, capture) pair gets its seed and offset holders (two one-element int64 tensors,
one 512-byte small-pool block each) at the capture's first draw from that state, freed when the
graph is reset or destroyed; a capture that draws nothing makes none (PyTorch's
test_graph_memory_stats_and_use_result_after_destroy_graph counts one small-pool block for a
capture of clones), on the default stream (pytorch/pytorch#176753: out of the capture's pool).
Builds before 2.14 (no `Generator.philox_state`) make them elsewhere: 2.12-2.13 a pair per
(state, capture) at capture_begin, up to 2.11 one pair per generator state when it registers
its first graph (harness/emulation/graph_rng_holders.py)."""

from __future__ import annotations

import gc

import pytest
import torch

pytestmark = pytest.mark.skipif(not hasattr(torch.Generator, "philox_state"),
                                reason="generator holders per capture came with torch 2.14")


def _small_active() -> tuple[int, int]:
    stats = torch.cuda.memory_stats()
    return stats["active.small_pool.current"], stats["active_bytes.small_pool.current"]


def _delta(before: tuple[int, int]) -> tuple[int, int]:
    now = _small_active()
    return now[0] - before[0], now[1] - before[1]


def test_a_capture_without_random_ops_holds_no_generator_state(cuda_kind):
    x = torch.ones(4, device="cuda")
    torch.cuda.synchronize()
    gc.collect()  # garbage of earlier tests must not be freed inside the measurement
    before = _small_active()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x + 1
    assert _delta(before) == (1, 512)  # y alone
    del g, y


def test_the_first_draw_of_a_capture_makes_two_holders_freed_at_reset(cuda_kind):
    torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    gc.collect()  # garbage of earlier tests must not be freed inside the measurement
    before = _small_active()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        a = torch.rand(4, device="cuda")
        b = torch.rand(4, device="cuda")  # the same state: no more holders
    assert _delta(before) == (4, 4 * 512)
    g.reset()
    del a, b
    gc.collect()
    torch.cuda.synchronize()
    assert _delta(before) == (0, 0)


def test_each_graph_has_its_own_holders(cuda_kind):
    torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    gc.collect()  # garbage of earlier tests must not be freed inside the measurement
    before = _small_active()
    graphs, outs = [], []
    for _ in range(3):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs.append(torch.rand(4, device="cuda"))
        graphs.append(g)
    assert _delta(before) == (3 * 3, 3 * 3 * 512)
    del graphs, outs, g
    gc.collect()
    torch.cuda.synchronize()
    assert _delta(before) == (0, 0)


def test_the_holders_are_on_the_default_stream_out_of_the_capture_pool(cuda_kind):
    """CUDAGeneratorCaptureState::initialize allocates under a guard of the default stream, so
    the holders land in the default pool, not the capture's (pytorch/pytorch#176753)."""
    torch.cuda.synchronize()
    gc.collect()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = torch.rand(4, device="cuda")
    default = torch.cuda.default_stream().cuda_stream
    placed = sorted((seg["stream"] == default, tuple(seg.get("segment_pool_id", (0, 0))) == (0, 0))
                    for seg in torch.cuda.memory_snapshot() for b in seg["blocks"]
                    if b["state"] == "active_allocated" and b["size"] == 512)
    # the output in the capture's pool on its stream; the two holders on the default stream's
    # segments of the default pool
    assert placed.count((True, True)) >= 2 and (False, False) in placed
    del g, out
