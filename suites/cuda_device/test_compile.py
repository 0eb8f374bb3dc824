"""`torch.compile` on the emulated CUDA device: inductor writes cpu code for it in every mode, on a
CPU wheel and on a CUDA wheel without a GPU; code compiled before entering runs inside; compiled
graphs are device ops the adversarial schedule orders and a capture records."""

from __future__ import annotations

import contextlib

import pytest
import torch

import harness
from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice
from harness.emulation.tracking import RaceError
from suites.cuda_device._tiny_llama import tiny_llama_with_cpu_tokens

MODES = {
    "inductor": {},
    "max-autotune-no-cudagraphs": {"mode": "max-autotune-no-cudagraphs"},
    "aot_eager": {"backend": "aot_eager"},
    "eager": {"backend": "eager"},
    "fullgraph": {"fullgraph": True},
    "dynamic": {"dynamic": True},
}


def _scaled_relu(x, w):
    return torch.relu(x @ w) + 1


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_compiles_for_the_device_and_equals_eager(cuda_device, mode):
    compiled = torch.compile(_scaled_relu, **MODES[mode])
    for rows in (4, 6):  # a second shape: a recompile (or the dynamic graph) runs on the device too
        x, w = torch.randn(rows, 8, device="cuda"), torch.randn(8, 8, device="cuda")
        out = compiled(x, w)
        assert out.is_cuda and out.device == torch.device("cuda", 0)
        torch.testing.assert_close(out, _scaled_relu(x, w))


def test_inductor_asks_torch_not_the_emulation_whether_cuda_is_there(cuda_device):
    seen = []

    def backend(gm, example_inputs):
        seen.append(torch.cuda.is_available())
        return gm.forward

    compiled = torch.compile(_scaled_relu, backend=backend)
    assert compiled(torch.ones(2, 8, device="cuda"), torch.ones(8, 8, device="cuda")).is_cuda
    # Inside the backend torch's own answer (a CPU wheel, or a CUDA wheel without a GPU, says no):
    # inductor picks Triton and builds its pattern tables from it.
    assert seen == [False]
    assert torch.cuda.is_available()


def test_code_compiled_before_entering_runs_on_the_device(outside_emulation):
    compiled = torch.compile(_scaled_relu)
    host = compiled(torch.ones(2, 8), torch.ones(8, 8))
    assert not host.is_cuda
    with harness.emulate_cuda(device="cpu"):
        layer = torch.nn.Linear(8, 3).cuda()
        x, w = torch.randn(2, 8, device="cuda"), torch.randn(8, 8, device="cuda")
        out = compiled(x, w)
        assert out.is_cuda
        torch.testing.assert_close(out, _scaled_relu(x, w))
        assert layer(out).is_cuda  # a host result would mix devices here
        assert not compiled(torch.ones(2, 8), torch.ones(8, 8)).is_cuda  # host stays host


@pytest.mark.parametrize("names_cuda", [
    lambda x: x + torch.ones(4, device="cuda"),
    lambda x: x.to("cuda") * 2,
    lambda x: x.cuda() * 2,
    lambda x: torch.zeros_like(x, device=x.device) + 2 * x,
], ids=["factory", "to", "cuda", "device_of_a_device_tensor"])
def test_compiled_code_that_names_cuda_compiles_for_the_device(cuda_device, names_cuda):
    x = torch.ones(4, device="cuda")
    out = torch.compile(names_cuda)(x)
    assert out.is_cuda and out.tolist() == [2.0] * 4


def test_a_compiled_module_keeps_its_device_parameters(cuda_device):
    layer = torch.nn.Linear(8, 8).cuda()
    compiled = torch.compile(layer)
    x = torch.randn(3, 8, device="cuda")
    with torch.no_grad():
        out = compiled(x)
        assert out.is_cuda
        torch.testing.assert_close(out, layer(x))


def _on_a_side_stream(x):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        return side, x + 1


@pytest.mark.parametrize("backend", ["inductor", "eager"])
def test_the_adversarial_schedule_runs_compiled_code_once_its_inputs_are_ready(
        outside_emulation, backend):
    with harness.emulate_cuda(device="cpu", schedule="adversarial"):
        compiled = torch.compile(lambda t: t * 2, backend=backend)
        x = torch.ones(4, device="cuda")
        side, y = _on_a_side_stream(x)
        torch.cuda.current_stream().wait_stream(side)
        assert compiled(y).tolist() == [4.0] * 4  # queued work read as poison gave nan


def test_the_adversarial_schedule_reports_a_compiled_read_of_an_unjoined_write(outside_emulation):
    with harness.emulate_cuda(device="cpu", schedule="adversarial", races="strict"):
        compiled = torch.compile(lambda t: t * 2)
        x = torch.ones(4, device="cuda")
        side, y = _on_a_side_stream(x)
        with pytest.raises(RaceError, match=r"harness_compiled.graph_\d+_\d+.default reads it on stream 0"):
            compiled(y)
        torch.cuda.synchronize()  # the host waits for the side stream before x and y die
        del x, y


def test_a_compiled_graph_writing_its_input_is_a_device_write(outside_emulation):
    def bump(cache, value):
        cache.add_(value)
        return cache.sum()

    with harness.emulate_cuda(device="cpu", schedule="adversarial"):
        compiled = torch.compile(bump)
        cache = torch.zeros(4, device="cuda")
        total = compiled(cache, torch.ones(4, device="cuda"))
        assert cache.tolist() == [1.0] * 4 and total.item() == 4.0


def test_a_compiled_graph_is_captured_and_runs_at_each_replay(cuda_device):
    compiled = torch.compile(_scaled_relu)
    x, w = torch.randn(4, 8, device="cuda"), torch.randn(8, 8, device="cuda")
    compiled(x, w)  # warm up: compile before capturing
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = compiled(x, w)
    for _ in range(2):
        x.copy_(torch.randn(4, 8, device="cuda"))
        graph.replay()
        torch.testing.assert_close(out, _scaled_relu(x, w))


class _Replays:
    def __init__(self) -> None:
        self.count = 0

    def on_replay(self, graph, stream) -> None:
        self.count += 1


def test_reduce_overhead_replays_through_the_emulated_graphs(cuda_device):
    compiled = torch.compile(_scaled_relu, mode="reduce-overhead")
    w = torch.randn(8, 8, device="cuda")
    replays = _Replays()
    outs = []
    with cuda_device.observe(replays):
        for call in range(4):
            # each call a step of its own: once any code in the process has marked a step, the
            # trees' generation moves only at the next mark (torch keeps the count process-wide)
            torch.compiler.cudagraph_mark_step_begin()
            x = torch.randn(4, 8, device="cuda")
            outs.append(compiled(x, w))
            torch.testing.assert_close(outs[-1], _scaled_relu(x, w))
        # warm-up, capture (and its replay), then one replay per call
        assert replays.count == 3
        # The graph's outputs are its own: the next replay rewrites what a caller kept.
        assert outs[2].data_ptr() == outs[3].data_ptr()
        with torch.no_grad():
            w.add_(1.0)  # a static address (here a plain input, copied in at each replay)
        x = torch.randn(4, 8, device="cuda")
        torch.testing.assert_close(compiled(x, w), _scaled_relu(x, w))


def test_reduce_overhead_reads_a_modules_parameters_at_their_address(cuda_device):
    layer = torch.nn.Linear(8, 8).cuda()
    compiled = torch.compile(layer, mode="reduce-overhead")
    x = torch.randn(2, 8, device="cuda")
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
        layer.weight.add_(1.0)  # parameters are not copied in: the replay reads them in place
        torch.testing.assert_close(compiled(x), layer(x))


def test_reduce_overhead_runs_a_graph_writing_a_plain_input_without_capturing_and_counts_it(
        cuda_device):
    def bump(counter):
        counter.add_(1)
        return counter * 2

    compiled = torch.compile(bump, mode="reduce-overhead")
    counter = torch.zeros(2, device="cuda")
    skips = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
    replays = _Replays()
    with cuda_device.observe(replays):
        for _ in range(3):
            out = compiled(counter)
    assert counter.tolist() == [3.0, 3.0] and out.tolist() == [6.0, 6.0]
    assert replays.count == 0  # as cudagraph trees: mutated inputs skip the graph
    assert torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] > skips


def _write_and_read(cache, x, pos):
    cache.index_copy_(0, pos, x)
    return cache[:2], (cache * 2).sum(0)


def test_a_compiled_graph_returning_a_view_of_its_input_runs_in_a_capture(cuda_kind):
    """transformers' static cache returns the buffers its forward writes; the emulated device ran
    a compiled graph as one op with fresh results only, and refused such a graph (before
    2026-12-06). CUDA returns the input's own memory, and so does the device now."""
    compiled = torch.compile(_write_and_read)
    cache = torch.zeros(4, 3, device="cuda")
    x = torch.ones(1, 3, device="cuda")
    pos = torch.zeros(1, dtype=torch.long, device="cuda")
    compiled(cache, x, pos)  # warm up: compile before capturing
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        head, total = compiled(cache, x, pos)
    torch.cuda.current_stream().wait_stream(stream)
    assert head.data_ptr() == cache.data_ptr()  # a view of the cache, not a copy
    for step in (1, 2):
        x.fill_(10.0 * step)
        pos.fill_(step)
        graph.replay()
    torch.cuda.synchronize()
    assert cache[:, 0].tolist() == [1.0, 10.0, 20.0, 0.0]
    assert head[:, 0].tolist() == [1.0, 10.0] and total.tolist() == [62.0] * 3


def _refused_in_the_sanitizer(cuda_kind):
    """The graph sanitizer refuses inductor's CUDA graphs by name (sanitizer.py): on the H100 they
    failed there with a false FreedMemoryError, or read memory no replay wrote."""
    if cuda_kind != "sanitizer":
        return contextlib.nullcontext()
    return pytest.raises(UnsupportedOnEmulatedDevice, match="cudagraph trees")


def test_reduce_overhead_equals_eager_call_after_call(cuda_kind):
    compiled = torch.compile(_scaled_relu, mode="reduce-overhead")
    w = torch.randn(8, 8, device="cuda")
    with _refused_in_the_sanitizer(cuda_kind):
        for _ in range(5):
            x = torch.randn(4, 8, device="cuda")
            torch.testing.assert_close(compiled(x, w), _scaled_relu(x, w))


def test_reduce_overhead_records_again_when_a_static_input_moves(cuda_kind):
    """A new static cache (transformers makes one per generate call): cudagraph trees record the
    graph again for the new address. The emulated device replayed the first recording, which wrote
    into the old cache and left the new one at zeros (before 2026-12-06)."""
    compiled = torch.compile(_write_and_read, mode="reduce-overhead")
    sums = []
    with _refused_in_the_sanitizer(cuda_kind):
        for round_ in range(2):
            cache = torch.zeros(4, 3, device="cuda")
            torch._dynamo.mark_static_address(cache)
            for step in range(4):
                x = torch.full((1, 3), float(step + 1 + 10 * round_), device="cuda")
                head, total = compiled(cache, x, torch.tensor([step], device="cuda"))
            torch.cuda.synchronize()
            sums.append(cache.sum().item())
            assert total.tolist() == [2 * cache[:, 0].sum().item()] * 3
        assert sums == [30.0, 150.0]


@pytest.mark.slow
def test_transformers_generates_twice_with_its_compiled_static_cache(cuda_device):
    """transformers compiles the forward of a static-cache generate itself (reduce-overhead), and
    makes a new cache for the second call: both agree with the CPU's tokens."""
    model, prompt, expected = tiny_llama_with_cpu_tokens()
    with torch.no_grad():
        model = model.to("cuda")
        for _ in range(2):
            out = model.generate(prompt.to("cuda"), max_new_tokens=8, do_sample=False,
                                 cache_implementation="static")
            assert out.device.type == "cuda" and torch.equal(out.cpu(), expected)
