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


def _counted(x, counter):
    position = torch.arange(2, device=x.device) + counter.to(x.device)
    counter.add_(2)
    return (x[position] * 2,)


@PARTITION
def test_a_graph_writing_a_host_scalar_records_its_device_work(reduce_overhead, partition):
    """With graph partition inductor moves a 0-dim host input to the device
    (`move_constructors_to_gpu`, whose ConstructorMoverPass takes cpu scalar placeholders when
    `triton.cudagraphs` and `graph_partition` are on): one copy in before the device work, the
    device work (the bump of the counter included) one partition that reads `x` and the copy,
    and the copy of the new value back into the counter after it, on the host. So the graph is
    recorded and no input of a recording is written. Without graph partition the counter stays
    on the host and the graph, writing an input, is skipped. Until 2026-12-07 the emulated
    device skipped it with graph partition too."""
    x = torch.rand(16, device="cuda")
    counter = torch.tensor(0)
    compiled = torch.compile(_counted, mode="reduce-overhead")
    with torch._inductor.config.patch(graph_partition=partition):
        for step in range(4):
            out = compiled(x, counter)
            torch.testing.assert_close(out[0].cpu(), x.cpu()[[2 * step, 2 * step + 1]] * 2)
    assert int(counter) == 8 and not counter.is_cuda
    assert (_recorded(), _skips()) == ((2, 0) if partition else (0, 1))


class _Scaled(torch.nn.Module):
    """A module on the device with a 0-dim host buffer (a static input of its graphs)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(4, device="cuda"))
        self.register_buffer("scale", torch.tensor(3.0))

    def forward(self, x):
        return (x * self.weight * self.scale,)


@PARTITION
def test_a_host_scalar_buffer_is_copied_to_the_device_before_the_recorded_work(reduce_overhead,
                                                                                partition):
    """The mover takes a static 0-dim host input too: with graph partition its copy on the
    device is a buffer of the graph, an input the recording copies in beside `x` (the weight
    is static). Without graph partition the input stays on the host, and inductor counts the
    device of each input a node uses (`GraphLowering.placeholder`), a cpu scalar's too: the
    graph is skipped ("cpu device"). Until 2026-12-07 the emulated device read the scalar in
    place either way: one recording copying `x` in, no skip."""
    module = _Scaled()
    with torch.no_grad(), torch._inductor.config.patch(graph_partition=partition):
        _four_calls(module, torch.rand(4, device="cuda"))
    assert (_recorded(), _skips()) == ((2, 0) if partition else (0, 1))
