"""`torch.cuda.empty_cache()` called while a capture is underway (a cleanup or memory-profiling
hook that runs inside the captured step): since torch 2.8 CUDA's allocator silently does nothing
(PyTorch #158152, https://github.com/pytorch/pytorch/pull/158152; before, an internal assert). The
capture completes and replays, and the cached segments stay reserved until a call after the
capture. The emulated device released them during the capture before 2026-12-06. Runs natively
on a GPU too."""

from __future__ import annotations

import torch


def test_empty_cache_during_capture_releases_nothing_and_the_graph_replays(cuda_kind):
    x = torch.ones(1024, device="cuda")
    cached = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    del cached  # a free segment of the regular pool, cached
    torch.cuda.synchronize()
    reserved = torch.cuda.memory_reserved()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    # capture_begin itself: `with torch.cuda.graph(g)` empties the cache before it begins
    with torch.cuda.stream(stream):
        graph.capture_begin()
        y = x * 2
        torch.cuda.empty_cache()
        during = torch.cuda.memory_reserved()
        out = y + 1
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    assert during >= reserved  # the cached segment is still there
    x.fill_(2.0)
    graph.replay()
    torch.cuda.synchronize()
    assert out.sum().item() == 5.0 * 1024
    del graph, y, out
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() < reserved  # released by a call after the capture
