"""How long memory of a graph's private pool stays the graph's, on the emulated CUDA device, as
CUDA's caching allocator keeps it: a block freed in a pool serves only later captures into that
pool while a graph holds it; once none does, the pool's memory stays mapped until the allocator
releases cached memory (empty_cache()), and only then may another allocation get its addresses.
A replay reading such memory is refused from that moment on, not before."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import FreedMemoryError


def _recaptured_over_its_own_output():
    # PyTorch's test_graph_capture_reset_recapture: the second capture of the same CUDAGraph
    # reads the first capture's output (a block of the first pool) and drops it at once.
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        a = torch.full((1000,), 1, device="cuda")
        g = torch.cuda.CUDAGraph()
        g.capture_begin()
        b = a
        for _ in range(3):
            b = b + 1
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    torch.cuda.synchronize()  # the replay on this stream is done before `s` drops its output
    g.reset()
    with torch.cuda.stream(s):
        g.capture_begin()
        b.fill_(2.0)
        for _ in range(3):
            b = b + 2
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    return g, b


def test_a_recapture_may_read_the_released_pool_until_its_memory_is_released(cuda_device):
    g, b = _recaptured_over_its_own_output()
    g.replay()
    assert b.sum().item() == 8000


def test_the_replay_is_refused_once_empty_cache_released_that_memory(cuda_device):
    g, b = _recaptured_over_its_own_output()
    torch.cuda.empty_cache()
    with pytest.raises(FreedMemoryError, match=r"another graph's private pool.*empty_cache"):
        g.replay()
