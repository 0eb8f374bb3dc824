"""The asynchronous pieces of a step loop (harness.runtime.async_io), each run where a missing
wait shows: on the emulated CUDA device with strict tracking (the race raises, naming the tensor
and both lines) and natively on a GPU with the producing stream stalled by torch.cuda._sleep after
a warmup (the race gives wrong values). These are the detectors of the fault zoo's asynchronous
family; each passes on the correct code."""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest
import torch

import harness
from harness.emulation import emulation_active
from harness.runtime.async_io import PinnedReadback, PinnedStaging, StagedGraph, run_on_side_stream
from fixtures.emulated_device import skip_unless_the_emulated_device_can_be_entered

N = 1 << 20
CYCLES = 200_000_000  # about 0.1 s on an H200


@pytest.fixture
def cuda(graph_backend) -> Iterator[None]:
    """CUDA: the real one on a GPU (--graph-backend cuda), else the emulated device, strict."""
    if graph_backend.name == "cuda":
        yield
        return
    skip_unless_the_emulated_device_can_be_entered()
    with harness.emulate_cuda(device="cpu", races="strict"):
        yield


def full(value: float) -> torch.Tensor:
    return torch.full((N,), float(value), device="cuda")


def test_pinned_staging_refills_a_buffer_after_its_copy(cuda):
    staging = PinnedStaging((N,), torch.float32, slots=2)
    targets = [torch.zeros(N, device="cuda") for _ in range(4)]
    staging.upload(torch.zeros(N), into=targets[0])  # warm up
    torch.cuda.synchronize()
    for step, target in enumerate(targets):
        torch.cuda._sleep(CYCLES)
        staging.upload(torch.full((N,), float(step)), into=target)
    torch.cuda.synchronize()
    assert [t[0].item() for t in targets] == [0.0, 1.0, 2.0, 3.0]


def test_pinned_readback_reads_what_the_device_wrote(cuda):
    readback = PinnedReadback((N,), torch.float32)
    x = full(3.0)
    readback.start(x * 2)  # warm up, the multiply's kernel too: a kernel's first launch loads its
    readback.result()      # module, which synchronizes the device and would hide the race
    readback.start(x)
    readback.result()
    torch.cuda._sleep(CYCLES)
    readback.start(x * 2)
    assert readback.result()[0] == 6.0


def test_side_stream_work_sees_the_producers_writes(cuda):
    side = torch.cuda.Stream()
    x = torch.ones(N, device="cuda")
    run_on_side_stream(lambda t: t + 1, x, stream=side)  # warm up
    torch.cuda.synchronize()
    x.mul_(1)  # the multiply's too: a kernel's first launch loads its module, a device-wide sync
    torch.cuda.synchronize()
    torch.cuda._sleep(CYCLES)
    x.mul_(5)
    y, done = run_on_side_stream(lambda t: t + 1, x, stream=side)
    torch.cuda.current_stream().wait_event(done)
    torch.cuda.synchronize()
    assert y[0].item() == 6.0


def test_side_stream_inputs_outlive_their_last_tensor(cuda):
    side = torch.cuda.Stream()

    def slow_sum(t: torch.Tensor) -> torch.Tensor:
        torch.cuda._sleep(CYCLES)
        return t.sum()

    run_on_side_stream(slow_sum, full(1.0), stream=side)  # warm up
    torch.cuda.synchronize()
    x = full(1.0)
    total, done = run_on_side_stream(slow_sum, x, stream=side)
    del x  # the block goes back to the main stream's pool
    reused = full(7.0)
    torch.cuda.current_stream().wait_event(done)
    torch.cuda.synchronize()
    assert total.item() / N == 1.0
    del reused


def test_staged_graph_inputs_wait_for_the_previous_replay(cuda):
    graph = StagedGraph(lambda s: s * 2, (N,), torch.float32)
    graph.write_inputs(torch.zeros(N))  # warm up
    graph.replay()
    torch.cuda.synchronize()
    results = []
    for step in range(3):
        graph.write_inputs(torch.full((N,), float(step + 1)))
        torch.cuda._sleep(CYCLES)
        results.append(graph.replay().clone())
    torch.cuda.synchronize()
    assert [r[0].item() for r in results] == [2.0, 4.0, 6.0]
