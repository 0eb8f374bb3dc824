"""Graphs, streams and events on the emulated device, with CUDA's capture rules for copies."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import CaptureError, get_backend


def test_torch_cuda_graph_captures_and_replays(cuda_device):
    x = torch.ones(4, device="cuda")
    g = torch.cuda.CUDAGraph()
    outside = torch.cuda.current_stream()
    with torch.cuda.graph(g):
        assert torch.cuda.is_current_stream_capturing()
        assert torch.cuda.current_stream() != outside  # a side stream, as in CUDA's implementation
        y = x * 2
    assert not torch.cuda.is_current_stream_capturing() and torch.cuda.current_stream() == outside
    x.fill_(3)
    g.replay()
    assert y.is_cuda and y.tolist() == [6.0] * 4


def test_capture_on_the_default_stream_is_refused(cuda_device):
    with pytest.raises(RuntimeError, match="CUDA graphs must be captured on a non-default stream"):
        torch.cuda.CUDAGraph().capture_begin()
    # torch 2.14's Python replay() instantiates first, whose check speaks first there.
    with pytest.raises(RuntimeError, match=r"without a preceding successful capture|"
                                           r"capture_end\(\) must have been called before"):
        torch.cuda.CUDAGraph().replay()


def test_a_pageable_host_to_device_copy_is_refused_during_capture(cuda_device):
    buffer = torch.zeros(3, device="cuda")
    for copy in (lambda: buffer.copy_(torch.ones(3)), lambda: torch.ones(3).to("cuda"),
                 lambda: torch.ones(3).cuda(), lambda: torch.tensor([1.0, 2.0], device="cuda")):
        with pytest.raises(CaptureError, match="pinned"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                copy()


def test_a_pinned_host_to_device_copy_is_captured_and_reread_at_each_replay(cuda_device):
    staging = torch.zeros(3).pin_memory()
    buffer = torch.zeros(3, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        buffer.copy_(staging, non_blocking=True)
        out = buffer * 10
    for value in (1.0, 2.0):
        staging.fill_(value)
        g.replay()
        assert out.tolist() == [10 * value] * 3


def test_a_device_to_host_copy_is_refused_during_capture(cuda_device):
    x = torch.ones(3, device="cuda")
    host = torch.zeros(3)
    for read in (lambda: x.cpu(), lambda: host.copy_(x), lambda: x.sum().item(), lambda: x.tolist()):
        with pytest.raises(CaptureError):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                read()


class HostTableRotary(torch.nn.Module):
    """The Phi-MoE shape: a rotary table kept as a plain attribute on the host, moved with
    `.to(x.device)` in every forward."""

    def __init__(self):
        super().__init__()
        self.inv_freq = 1.0 / 10000 ** (torch.arange(0, 8, 2).float() / 8)

    def forward(self, x):
        return x * self.inv_freq.to(x.device)


def test_a_forgotten_host_table_moved_in_forward_is_refused_at_capture(cuda_device):
    model, x = HostTableRotary(), torch.ones(2, 4, device="cuda")
    model(x)  # eager: a copy each call, as on CUDA
    with pytest.raises(CaptureError, match="pageable"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            model(x)


def test_the_plain_cpu_emulator_accepts_the_forgotten_host_table():
    # The cpu-device mode can only guess host memory from how a tensor was made during capture;
    # the table was made before, so it passes there (the emulated CUDA device refuses it).
    model, x = HostTableRotary(), torch.ones(2, 4)
    graph = get_backend("emulated", device="cpu").capture(lambda: model(x))
    graph.replay()
    assert torch.equal(graph.output, model(x))


def test_ladder_shares_one_pool_and_make_graphed_callables_runs(cuda_device):
    x = torch.ones(4, device="cuda")
    g1 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1):
        a = x + 1
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2, pool=g1.pool()):
        b = x + 2
    assert g2.pool() is g1.pool()
    g1.replay(); g2.replay()
    assert a.tolist() == [2.0] * 4 and b.tolist() == [3.0] * 4
    layer = torch.nn.Linear(4, 2).cuda()
    graphed = torch.cuda.make_graphed_callables(layer, (torch.ones(3, 4, device="cuda", requires_grad=True),))
    inp = torch.randn(3, 4, device="cuda", requires_grad=True)
    torch.testing.assert_close(graphed(inp), layer(inp))


def test_streams_and_events_keep_cudas_api(cuda_device):
    s = torch.cuda.Stream(priority=-1)
    assert s != torch.cuda.default_stream() and s == s and hash(s) == hash(s)
    assert torch.cuda.default_stream().cuda_stream == 0 and s.cuda_stream != 0 and s.priority == -1
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(s):
        assert torch.cuda.current_stream() == s
        start.record()
        torch.ones(8, device="cuda").sum()
        end.record()
    s.wait_stream(torch.cuda.current_stream())
    torch.cuda.current_stream().wait_event(end)
    end.synchronize()
    assert start.query() and s.query() and start.elapsed_time(end) >= 0
    with pytest.raises(ValueError, match="enable_timing"):
        torch.cuda.Event().elapsed_time(end)


def test_observers_hear_device_ops_with_their_stream(cuda_device):
    class Ops:
        def __init__(self):
            self.ops = []

        def on_op(self, op, args, kwargs, result, stream):
            self.ops.append((getattr(op, "__name__", op), stream))

    s = torch.cuda.Stream()
    x = torch.ones(2, device="cuda")
    s.wait_stream(torch.cuda.current_stream())  # x is written on the default stream first
    with cuda_device.observe(Ops()) as seen, torch.cuda.stream(s):
        x.add_(1)
        torch.ones(2).cuda()
    assert seen.ops == [("add_", s), ("Tensor.cuda", s)]


def test_new_tensor_of_host_data_on_a_device_tensor_is_refused_during_capture(cuda_device):
    """`x.new_tensor(data)` copies host data to x's device: a pageable copy CUDA refuses."""
    x = torch.ones(4, device="cuda")
    for build in (lambda: x.new_tensor([1.0, 2.0, 3.0, 4.0]),
                  lambda: torch.ones(2).new_tensor([1.0], device="cuda")):
        with pytest.raises(CaptureError, match="pageable"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                build()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x.new_tensor(x)  # device data: a device-to-device copy, captured
    assert y.is_cuda


def test_indexing_with_host_indices_is_refused_during_capture(cuda_device):
    """CUDA moves a host index tensor (or a list of ints) to the indexed tensor's device before
    indexing (ATen's make_info): during capture a pageable copy it refuses. Device indices, slices
    and ints capture."""
    x = torch.arange(6.0, device="cuda")
    rows = torch.tensor([0, 2], device="cuda")
    for index in (lambda: x[torch.tensor([0, 2])], lambda: x[[0, 2]],
                  lambda: x[torch.tensor([True, False, True, False, False, False])],
                  lambda: x.view(3, 2)[torch.tensor([0, 1]), 0],
                  lambda: x.view(1, 3, 2)[..., [-2], :],  # Falcon's fused_qkv[..., [-2], :]
                  lambda: x.index_put_((torch.tensor([1]),), x[:1])):
        with pytest.raises(CaptureError, match="Cannot copy between CPU and CUDA tensors.*\n.*as an index"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                index()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x[rows] + x[1:3].sum() + x[4]
    x.copy_(torch.arange(6.0, device="cuda") * 10)
    g.replay()
    assert y.tolist() == [0.0 + 30 + 40, 20.0 + 30 + 40]

