"""Inductor's graph partition on the emulated CUDA device (harness/emulation/compiled_partitions.py):
a reduce-overhead graph with host work beside its device work is split, and each partition of
device work is recorded and replayed through CUDA graphs (graph partition on, inductor's default
since torch 2.11), or the whole graph runs without them, the skip counted (graph partition off;
dynamo's `backend="cudagraphs"` always). The `cuda_kind` rows run natively on a GPU to show
CUDA's answer. A recording is seen in inductor's count of the inputs each one copies in
(`cudagraph_recorded_non_static_inputs`), which torch's trees and the device's stand-in keep."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

PARTITION = pytest.mark.parametrize("partition", [False, True], ids=["whole", "partitioned"])


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@pytest.fixture
def reduce_overhead(cuda_kind):
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's cudagraph trees by name")
    return cuda_kind


def _recorded() -> int:
    return counters["inductor"]["cudagraph_recorded_non_static_inputs"]


def _skips() -> int:
    return counters["inductor"]["cudagraph_skips"]


def _four_calls(fn, *args):
    """Warm-up, recording, two replays; each result checked against eager's."""
    compiled = torch.compile(fn, mode="reduce-overhead")
    for _ in range(4):
        out, expected = compiled(*args), fn(*args)
        for o, e in zip(out, expected):
            assert o.device == e.device
            torch.testing.assert_close(o.cpu(), e.cpu())
    return out


def _an_empty_host_tensor_beside(x):
    return x @ x, torch.tensor([])


@PARTITION
def test_a_graph_returning_an_empty_host_tensor_records_its_device_work(reduce_overhead,
                                                                        partition):
    """Inductor counts no cpu node for an empty cpu buffer (so that such a graph gets CUDA graphs,
    PyTorch's test_empty_cpu_tensor), and with graph partition its cpu node runs between the
    partitions. Until 2026-12-07 the emulated device counted it: with graph partition the graph
    ran without CUDA graphs and nothing was recorded, without it the whole graph was skipped."""
    x = torch.rand(4, device="cuda")
    with torch._inductor.config.patch(graph_partition=partition):
        out = _four_calls(_an_empty_host_tensor_beside, x)
    assert out[0].is_cuda and not out[1].is_cuda and out[1].numel() == 0
    assert (_recorded(), _skips()) == (1, 0)  # `x`, read by the matmul's recording


def _device_host_device(x):
    a = x * 2
    b = a.cpu() + 1
    return b.cuda() * 3, b


@PARTITION
def test_host_work_between_device_work_splits_the_graph_in_two_recordings(reduce_overhead,
                                                                          partition):
    """Graph partition cuts a graph at its copies and host ops: `x * 2` and `b.cuda() * 3` are
    two partitions of device work, each recorded (each copying its one input in), with the copy
    to the host, `+ 1` and the copy back running between them. Without graph partition the
    graph is skipped ("cpu device"), as before. Until 2026-12-07 a partitioned graph ran without
    CUDA graphs on the emulated device."""
    x = torch.rand(4, device="cuda")
    with torch._inductor.config.patch(graph_partition=partition):
        _four_calls(_device_host_device, x)
    assert (_recorded(), _skips()) == ((2, 0) if partition else (0, 1))


def _device_and_host_beside(x, y):
    return x @ x, y * 2 + 1


def test_dynamos_cudagraphs_backend_skips_a_graph_with_host_work(reduce_overhead):
    """Dynamo's `backend="cudagraphs"` has no graph partition: it skips a graph with a cpu node
    ("cpu device") whatever inductor's `graph_partition` says. Until 2026-12-07 the emulated
    device ran such a graph without CUDA graphs and counted no skip, as for a partitioned one."""
    x, y = torch.rand(3, 3, device="cuda"), torch.rand(3)
    compiled = torch.compile(_device_and_host_beside, backend="cudagraphs")
    with torch._inductor.config.patch(graph_partition=True):
        for _ in range(3):
            out = compiled(x, y)
    torch.testing.assert_close(out[1], y * 2 + 1)
    assert (_recorded(), _skips()) == (0, 1)
