"""Copies between host and device memory inside `torch.compile`d code: their results are host or
device memory as on CUDA. Dynamo traces the emulated device's tensors as the cpu tensors they are,
where a copy between host and device is a no-op; until 2026-12-06 every output of a graph with a
device input was device memory and every output of one without was host memory, so transformers'
offloaded static cache (its compiled update prefetches host keys to the device) met a mixed-device
error in attention."""

from __future__ import annotations

import pytest
import torch

from harness.emulation.tracking import RaceError
from suites.cuda_device._tiny_llama import prefetch_waits_for_the_offload, tiny_llama_with_cpu_tokens


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("to_device", [
    lambda h: h.to("cuda", non_blocking=True),
    lambda h: h.to("cuda") * 2,
    lambda h: h.cuda(),
    lambda h: h.to(device=torch.device("cuda"), non_blocking=True) + torch.ones(3, device="cuda"),
    lambda h: h.to(0) + 1,
    lambda h: h.to(0, torch.float64, True),
], ids=["to_non_blocking", "to_then_compute", "cuda", "to_device_kwarg_and_factory",
        "to_an_index", "to_an_index_dtype_and_non_blocking"])
def test_a_compiled_copy_of_host_memory_to_the_device_is_device_memory(cuda_kind, to_device):
    host = torch.arange(3.0).pin_memory()
    out = torch.compile(to_device)(host)
    torch.cuda.synchronize()
    assert out.is_cuda
    assert out.cpu().tolist() == to_device(host).cpu().tolist()


@pytest.mark.parametrize("to_host, expected", [
    (lambda d: d.to("cpu"), [0.0, 1.0, 2.0]),
    (lambda d: (d * 2).cpu(), [0.0, 2.0, 4.0]),
    (lambda d: d.to("cpu", non_blocking=True), [0.0, 1.0, 2.0]),
], ids=["to", "compute_then_cpu", "to_non_blocking"])
def test_a_compiled_copy_of_device_memory_to_the_host_is_host_memory(cuda_kind, to_host, expected):
    device = torch.arange(3.0, device="cuda")
    out = torch.compile(to_host)(device)
    torch.cuda.synchronize()
    assert not out.is_cuda
    assert out.tolist() == expected


def test_each_output_of_a_compiled_graph_is_in_its_own_inputs_memory(cuda_kind):
    def both(host, device):
        return host + 1, device + 1, torch.zeros(2, device="cuda")

    host, device = torch.ones(2), torch.ones(2, device="cuda")
    on_host, on_device, made = torch.compile(both)(host, device)
    assert (on_host.is_cuda, on_device.is_cuda, made.is_cuda) == (False, True, True)
    assert on_host.tolist() == on_device.cpu().tolist() == [2.0, 2.0]


def _scaled_on_the_device(x, z):
    return x * z.cuda() + torch.ones(4, device="cuda")


@pytest.mark.parametrize("backend", [None, "aot_eager", "aot_eager_decomp_partition", "inductor"],
                         ids=["eager", "aot_eager", "aot_eager_decomp_partition", "inductor"])
def test_the_gradient_of_a_host_tensor_copied_to_the_device_is_host_memory(cuda_kind, backend):
    """CUDA's ToCopyBackward copies the gradient back to the copied tensor's device: a host
    leaf's `.grad` is host memory. Until 2026-12-07 it stayed device memory on the emulated
    device (the engine's copy is between cpu tensors), and a graph of a backend of eager ops
    (aot_eager) ran dynamo's graph instead of AOTAutograd's, whose transfers were traced into
    views. Inductor's backward graph copies it back itself (the transfer's `device_put` to the
    host); on the emulated device that graph kept the transfer a view, and the gradient stayed
    device memory until later on 2026-12-07. The gradient of `x * z.cuda()` with respect to `z`
    is `x`."""
    fn = _scaled_on_the_device if backend is None else torch.compile(_scaled_on_the_device,
                                                                     backend=backend)
    x = torch.randn(4, device="cuda", requires_grad=True)
    z = torch.randn(4, requires_grad=True)
    out = fn(x, z)
    out.sum().backward()
    assert out.is_cuda and x.grad.is_cuda and not z.grad.is_cuda
    torch.testing.assert_close(z.grad, x.detach().cpu())
    torch.testing.assert_close(x.grad, z.detach().cuda())


def test_a_compiled_factory_naming_cuda_without_inputs_is_device_memory(cuda_kind):
    out = torch.compile(lambda: torch.full((2,), 3.0, device="cuda"))()
    assert out.is_cuda and out.cpu().tolist() == [3.0, 3.0]


@pytest.mark.parametrize("nested_graph_breaks", [False, True], ids=["breaks", "nested_breaks"])
def test_a_compiled_factory_asked_for_a_gradient_is_a_leaf_on_the_device(cuda_kind,
                                                                         nested_graph_breaks):
    """Dynamo breaks the graph at a factory with `requires_grad=True` and runs it eagerly: a
    leaf, which takes a post-accumulate-grad hook and accumulates its own `.grad`. With nested
    graph breaks (PyTorch's test cases turn them on) the break fell inside the emulated device's
    traced call, whose marker of device memory then ran as a graph of its own: until 2026-12-07
    the result was a non-leaf (`ToCopyBackward0`) and the hook was refused."""
    def make(x):
        return torch.ones(3, device="cuda", requires_grad=True)

    with torch._dynamo.config.patch(nested_graph_breaks=nested_graph_breaks):
        out = torch.compile(make)(torch.ones(3, device="cuda", requires_grad=True))
    assert out.is_cuda and out.is_leaf and out.grad_fn is None
    seen = []
    out.register_post_accumulate_grad_hook(lambda leaf: seen.append(leaf.grad.sum().item()))
    (out * 2).sum().backward()
    assert seen == [6.0] and out.grad.is_cuda


def _prefetch_three_steps() -> tuple[int, int]:
    """A reduce-overhead graph reading a pinned host tensor beside a device one, three calls (warm
    up, record, replay); inductor's skips and the graphs' values are checked."""
    def add_prefetched(host, device):
        return device + host.to("cuda", non_blocking=True)

    compiled = torch.compile(add_prefetched, mode="reduce-overhead")
    skips = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
    device = torch.ones(3, device="cuda")
    for step in range(3):
        host = torch.full((3,), float(step)).pin_memory()
        out = compiled(host, device)
        torch.cuda.synchronize()
        assert out.is_cuda and out.cpu().tolist() == [1.0 + step] * 3
    return skips, torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]


def test_reduce_overhead_counts_no_skip_for_a_graph_of_device_memory(cuda_kind):
    """inductor compiles the emulated device's graphs for the cpu and counted a skip ("cpu
    device") for each, also from its cache; CUDA counts none."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's CUDA graphs by name")
    torch._dynamo.reset()
    skips = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
    compiled = torch.compile(lambda x: x * 2 + 1, mode="reduce-overhead")
    x = torch.ones(3, device="cuda")
    for _ in range(3):
        out = compiled(x)
    assert out.tolist() == [3.0] * 3
    assert torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] == skips


def test_reduce_overhead_partitions_a_graph_that_reads_host_memory(cuda_kind):
    """With graph partition (inductor's default) a graph with cpu nodes is split, not skipped: no
    skip is counted (measured on an H100, torch 2.11), and the values are right."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's CUDA graphs by name")
    torch._dynamo.reset()
    with torch._inductor.config.patch(graph_partition=True):
        before, after = _prefetch_three_steps()
    assert after == before


def test_reduce_overhead_without_graph_partition_skips_a_graph_that_reads_host_memory(cuda_kind):
    """Without graph partition inductor runs such a graph without CUDA graphs ("skipping cudagraphs
    due to cpu device") and counts it."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's CUDA graphs by name")
    torch._dynamo.reset()
    with torch._inductor.config.patch(graph_partition=False):
        before, after = _prefetch_three_steps()
    assert after > before


def test_layers_offloaded_and_prefetched_by_compiled_copies_round_trip(cuda_kind):
    """The offloaded static cache's life, with torch.cuda only: each layer's buffer waits in
    pinned host memory, a compiled copy brings it to the device on a side stream, a compiled
    update writes one position of it there, and a copy takes it back to the host."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's CUDA graphs by name")
    prefetch = torch.compile(lambda k: k.to("cuda", non_blocking=True), mode="reduce-overhead")

    def update(keys, pos, x):
        keys.index_copy_(0, pos, x)
        return keys.sum()

    update = torch.compile(update, mode="reduce-overhead")
    layers = [torch.zeros(4, 2).pin_memory() for _ in range(2)]
    side = torch.cuda.Stream()
    totals = []
    for step in range(3):
        for i in range(2):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                keys = prefetch(layers[i])
            torch.cuda.current_stream().wait_stream(side)
            assert keys.is_cuda
            x = torch.full((1, 2), float(10 * step + i), device="cuda")
            totals.append(update(keys, torch.tensor([step], device="cuda"), x).item())
            layers[i] = keys.to("cpu", non_blocking=True)
            assert not layers[i].is_cuda
    torch.cuda.synchronize()
    assert [layer[:, 0].tolist() for layer in layers] == [[0.0, 10.0, 20.0, 0.0],
                                                          [1.0, 11.0, 21.0, 0.0]]
    assert totals == [0.0, 2.0, 20.0, 24.0, 60.0, 66.0]


def test_transformers_generates_with_its_offloaded_static_cache(cuda_device):
    """transformers' offloaded static cache keeps each layer in pinned host memory and prefetches
    the next one on a side stream inside the forward it compiles (reduce-overhead): its tokens are
    the static cache's. It failed with a mixed-device error in attention before 2026-12-06."""
    model, prompt, expected = tiny_llama_with_cpu_tokens()
    with torch.no_grad():
        model.to("cuda")
        if not prefetch_waits_for_the_offload():
            # transformers before the fix: its own race, which the tracking reports
            with pytest.raises(RaceError, match=r"(?s)cache_utils\.py.*non_blocking=True"):
                model.generate(prompt.to("cuda"), max_new_tokens=8, do_sample=False,
                               cache_implementation="offloaded_static")
            return
        out = model.generate(prompt.to("cuda"), max_new_tokens=8, do_sample=False,
                             cache_implementation="offloaded_static")
    assert out.device.type == "cuda" and torch.equal(out.cpu(), expected)


def _moved_then_bumped(moved):
    def step(source, weight):
        copy = moved(source, weight)
        copy.add_(1)  # transformers' StaticLayer: `cumulative_length.to(device)`, then `add_`
        return copy * weight
    return step


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("moved", [
    lambda s, w: s.to("cuda"),
    lambda s, w: s.to(w.device),
    lambda s, w: s.cuda(),
    lambda s, w: s.to("cuda", non_blocking=True),
    lambda s, w: s.to(w.device, non_blocking=True),
    lambda s, w: s.cuda(non_blocking=True),
], ids=["to_cuda", "to_a_device_read", "cuda", "to_cuda_non_blocking",
        "to_a_device_read_non_blocking", "cuda_non_blocking"])
def test_a_compiled_copy_of_host_memory_is_a_new_tensor(cuda_kind, backend, moved):
    """The `non_blocking` rows stayed views of the host tensor until 2026-12-07 (the blocking
    ones until stop 58)."""
    host = torch.tensor(0.0).pin_memory()
    out = torch.compile(_moved_then_bumped(moved), backend=backend)(host, torch.ones(2, device="cuda"))
    assert (host.item(), out.tolist(), out.is_cuda) == (0.0, [1.0, 1.0], True)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("non_blocking", [False, True], ids=["blocking", "non_blocking"])
def test_a_compiled_copy_of_device_memory_to_the_host_is_a_new_tensor(cuda_kind, backend,
                                                                      non_blocking):
    def step(device):
        if non_blocking:
            on_host = device.to("cpu", non_blocking=True)
            torch.cuda.current_stream().synchronize()  # the copy done before the host writes
        else:
            on_host = device.cpu()
        on_host.add_(1)
        return on_host

    device = torch.zeros(2, device="cuda")
    out = torch.compile(step, backend=backend)(device)
    assert (device.tolist(), out.tolist(), out.is_cuda) == ([0.0, 0.0], [1.0, 1.0], False)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_a_compiled_move_of_device_memory_to_the_device_is_the_tensor_itself(cuda_kind, backend):
    def step(device):
        same = device.to("cuda")  # no copy on CUDA: the in-place op writes the input
        same.add_(1)
        return same * 2

    device = torch.zeros(2, device="cuda")
    out = torch.compile(step, backend=backend)(device)
    assert (device.tolist(), out.tolist()) == ([1.0, 1.0], [2.0, 2.0])
