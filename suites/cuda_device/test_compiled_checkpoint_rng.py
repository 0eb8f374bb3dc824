"""Activation checkpointing's random ops through AOTAutograd on the emulated CUDA device
(harness/emulation/compiled_rng.py): the partitioner wraps a checkpointed random op on device
memory in CUDA's graph-safe wrapper, the forward and the backward's recompute draw the same
numbers from the device's generator, and a random aten op that AOTAutograd's graphs call as eager
code draws on the device. The `cuda_kind` rows run natively on a GPU to show CUDA's answer."""

from __future__ import annotations

import contextlib
import functools
from collections import defaultdict

import pytest
import torch
from torch.utils._mode_utils import no_dispatch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _wrappers():
    from torch._prims import rng_prims

    return {name: getattr(rng_prims, name) for name in
            ("graphsafe_run_with_rng_state", "run_and_save_rng_state", "run_with_rng_state")}


def _observer():
    """A dispatch mode with a rule for each wrapper (as PyTorch's TestSAC observes them): it
    records which wrapper ran which op, and what the op made."""

    class Observer(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.outputs = defaultdict(list)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    for name, hop in _wrappers().items():
        def rule(mode, *args, _hop=hop, _name=name, **kwargs):
            with no_dispatch():
                out = _hop(*args, **kwargs)
            op = next(a for a in (*args, *kwargs.values()) if isinstance(a, torch._ops.OpOverload))
            mode.outputs[(_name, op)].append(out[1] if _name == "run_and_save_rng_state" else out)
            return out

        hop.py_impl(Observer)(rule)
    return Observer()


def _checkpointed(x, y):
    def region(x, y):
        return torch.sigmoid(torch.rand_like(x) * y) * x

    x = torch.sin(x)
    x = torch.utils.checkpoint.checkpoint(region, x, y, use_reentrant=True)
    return torch.sin(x)


def test_a_checkpointed_random_op_on_the_device_is_wrapped_graph_safe(cuda_kind):
    """Until 2026-12-07 AOTAutograd's partitioner wrapped a checkpointed random op of device
    tensors in the cpu's `run_and_save_rng_state`/`run_with_rng_state` (it picks by the traced
    value's device, a cpu tensor on the emulated device), the op drew host memory from the cpu's
    generator, and the backward's recompute, under the device's marking of the engine's results,
    met "no rule registered for HigherOrderOperator run_with_rng_state". CUDA wraps it in
    `graphsafe_run_with_rng_state` and the recompute draws what the forward drew."""
    from torch._dynamo.backends.debugging import aot_eager_decomp_partition_with_mode

    observer = _observer()
    backend = functools.partial(aot_eager_decomp_partition_with_mode, mode=observer)
    x = torch.randn(4, 4, device="cuda", requires_grad=True)
    y = torch.randn(4, 4, device="cuda", requires_grad=True)
    torch.compile(_checkpointed, backend=backend)(x, y).sum().backward()
    assert sorted(name for name, _ in observer.outputs) == ["graphsafe_run_with_rng_state"]
    forward, recomputed = observer.outputs[("graphsafe_run_with_rng_state", aten.rand.default)]
    assert forward.is_cuda and recomputed.is_cuda
    torch.testing.assert_close(forward, recomputed, rtol=0, atol=0)
    assert x.grad.is_cuda and y.grad.is_cuda


def test_the_recompute_of_a_checkpointed_random_op_draws_what_the_forward_drew(cuda_kind):
    """Without an observer the wrapper meets the device's own dispatch modes (the stream
    tracking), which ran it with torch functions off, so the wrapper's CUDA kernel read the
    device tensor's device as the cpu ("GraphSafe RNG operations not supported for device
    'cpu'"). The gradient of `rand_like(x) * x` is the forward's draw only if the recompute drew
    the same numbers."""
    def region(x):
        return torch.rand_like(x) * x

    def fn(x):
        return torch.utils.checkpoint.checkpoint(region, x, use_reentrant=True)

    x = torch.rand(4, 4, device="cuda", requires_grad=True) + 1
    x.retain_grad()
    out = torch.compile(fn, backend="aot_eager_decomp_partition")(x)
    out.sum().backward()
    assert out.is_cuda and x.grad.is_cuda
    torch.testing.assert_close(x.grad, (out / x).detach())


@pytest.mark.parametrize("dispatch", ["on", "off"])
def test_a_random_aten_op_called_itself_draws_from_the_devices_generator(cuda_kind, dispatch):
    """AOTAutograd's graphs, run as eager code, call random aten ops themselves
    (`aten.rand.default(..., device=...)`), and a wrapper's rule in a dispatch mode calls the op
    under `no_dispatch()`. The emulated device drew such a call from the cpu's generator (it
    met only torch's own random functions, and under `no_dispatch()` no dispatch mode at all).
    On CUDA it draws from the device's generator, as `torch.rand` does."""
    torch.cuda.manual_seed(7)
    with no_dispatch() if dispatch == "off" else contextlib.nullcontext():
        drawn = aten.rand.default([8], device=torch.device("cuda"))
    torch.cuda.manual_seed(7)
    expected = torch.rand(8, device="cuda")
    assert drawn.is_cuda
    torch.testing.assert_close(drawn, expected, rtol=0, atol=0)


def test_inductor_and_aot_eager_draw_the_same_for_a_checkpointed_random_op(cuda_kind):
    """PyTorch's TestSAC.test_cudagraphs_aot_eager_compat_equal: with aten's random kernels kept
    (`fallback_random`) and the graph-safe wrapper still chosen, a checkpointed random op draws
    the same numbers compiled by inductor under reduce-overhead as by aot_eager, since both draw
    from graph-safe states seeded alike. Inductor's compile on the emulated device kept the cpu's
    wrappers, drawing other numbers from another generator."""
    from torch._inductor import config

    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's CUDA graphs by name")
    if not hasattr(config.test_configs, "graphsafe_rng_func_ignores_fallback_random"):
        pytest.skip("this torch has no test_configs.graphsafe_rng_func_ignores_fallback_random")
    runs = []
    with config.patch(fallback_random=True), config.patch(
            "test_configs.graphsafe_rng_func_ignores_fallback_random", True):
        for compile_fn in (lambda f: torch.compile(f, backend="aot_eager_decomp_partition"),
                           lambda f: torch.compile(f, mode="reduce-overhead")):
            torch._dynamo.reset()
            torch.manual_seed(0)
            run = []
            for _ in range(3):  # a warm-up, a recording and a replay under reduce-overhead
                x = torch.randn(4, 4, device="cuda", requires_grad=True)
                y = torch.randn(4, 4, device="cuda", requires_grad=True)
                out = compile_fn(_checkpointed)(x, y)
                out.sum().backward()
                run.append((out.detach().clone(), x.grad.clone(), y.grad.clone()))
            runs.append(run)
    for eager_graphs, inductor in zip(*runs):
        for a, b in zip(eager_graphs, inductor):
            assert b.is_cuda
            torch.testing.assert_close(a, b)


def test_the_accelerators_default_generator_is_the_devices(cuda_kind):
    """`torch.accelerator.random.get_rng_state()` (and inductor's lowering of a graph-safe random
    op) asks `torch._C._accelerator_getDefaultGenerator`, which reached torch's own CUDA runtime
    on the emulated device ("Expected idx >= 0 && idx < num_gpus" on a CUDA wheel without a
    GPU)."""
    accelerator_random = getattr(torch.accelerator, "random", None)
    if not hasattr(accelerator_random, "get_rng_state"):
        pytest.skip("this torch has no torch.accelerator.random.get_rng_state")
    torch.cuda.manual_seed(11)
    torch.rand(3, device="cuda")
    assert torch.equal(accelerator_random.get_rng_state(), torch.cuda.get_rng_state())


def test_a_random_op_meeting_an_input_thousands_of_ops_later_is_on_its_device():
    """Which random ops are device memory follows the graph's ops from its inputs; a graph whose
    input is met again past a chain of a thousand ops (a residual connection) overflowed Python's
    recursion limit there (RecursionError at compile time)."""
    from harness.emulation.compiled_rng import device_rng_ops

    graph = torch.fx.Graph()
    x = graph.placeholder("primals_1")
    x.meta["val"] = torch.empty(4)
    h = x
    for _ in range(1200):
        h = graph.call_function(aten.add.Tensor, (h, 1))
        h.meta["val"] = torch.empty(4)
    rand = graph.call_function(aten.rand.default, ([4],), {"device": torch.device("cpu")})
    rand.meta["val"] = torch.empty(4)
    product = graph.call_function(aten.mul.Tensor, (rand, x))
    product.meta["val"] = torch.empty(4)
    total = graph.call_function(aten.add.Tensor, (product, h))
    total.meta["val"] = torch.empty(4)
    graph.output(total)
    module = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert device_rng_ops(module, (1,)) == {rand.name: 1}
    assert device_rng_ops(module, ("host",)) == {}


@pytest.mark.parametrize("stream_made", [False, True], ids=["default_stream", "after_a_stream"])
def test_a_host_region_recomputed_in_the_backward_stays_on_the_host(cuda_kind, stream_made):
    """A checkpointed region of host tensors, whose result goes to the device, is recomputed
    inside `backward()`, a call on the device: its own calls are host calls there as in the
    forward. Until 2026-12-07 they counted as the device call's (once the stream tracking was
    on, after any stream was made), so `randperm(n, device=z.device)` made device memory and met
    the host `z`: a mixed-device error (PyTorch's TestSAC.test_cpu_and_cuda_rng, whose compiled
    region of host and device tensors runs as such eager code on the emulated device)."""
    if stream_made:
        torch.cuda.Stream()

    def region(z):
        return z * torch.randperm(z.numel(), device=z.device).reshape(z.shape)

    x = torch.ones(2, 2, device="cuda", requires_grad=True)
    z = torch.ones(2, 2, requires_grad=True)
    out = x * torch.utils.checkpoint.checkpoint(region, z, use_reentrant=True).cuda()
    out.sum().backward()
    # d(out)/dz is the permutation the forward drew, if the recompute drew it again on the host
    assert sorted(z.grad.flatten().tolist()) == [0.0, 1.0, 2.0, 3.0]
    assert z.grad.flatten().tolist() == out.detach().flatten().tolist()


def test_checkpointed_random_ops_of_host_and_device_regions_joined_by_a_transfer(cuda_kind):
    """A compiled function whose checkpointed regions work on device and on host memory, joined
    by a transfer (`z.cuda()`), runs AOTAutograd's graphs: the device region's random op wrapped
    graph-safe, the host region's in the cpu's wrappers, each recompute drawing what its forward
    drew, and the host tensor's gradient back on the host (PyTorch's
    TestSAC.test_cpu_and_cuda_rng). Until 2026-12-07 AOTAutograd traced the transfer into a view,
    so the emulated device ran dynamo's graph as its eager ops instead, and no wrapper ran."""
    from torch._dynamo.backends.debugging import aot_eager_decomp_partition_with_mode

    def on_the_host(z):
        return z * torch.randperm(z.numel(), device=z.device).reshape(z.shape)

    def fn(x, y, z):
        x = _checkpointed(x, y)
        z = torch.utils.checkpoint.checkpoint(on_the_host, z, use_reentrant=True)
        return x * z.cuda()

    observer = _observer()
    backend = functools.partial(aot_eager_decomp_partition_with_mode, mode=observer)
    x = torch.randn(4, 4, device="cuda", requires_grad=True)
    y = torch.randn(4, 4, device="cuda", requires_grad=True)
    z = torch.randn(4, 4, requires_grad=True)
    torch.compile(fn, backend=backend)(x, y, z).sum().backward()
    assert sorted(observer.outputs) == [
        ("graphsafe_run_with_rng_state", aten.rand.default),
        ("run_and_save_rng_state", aten.randperm.default),
        ("run_with_rng_state", aten.randperm.default)]
    forward, recomputed = observer.outputs[("graphsafe_run_with_rng_state", aten.rand.default)]
    assert forward.is_cuda and recomputed.is_cuda
    torch.testing.assert_close(forward, recomputed, rtol=0, atol=0)
    (saved,) = observer.outputs[("run_and_save_rng_state", aten.randperm.default)]
    (again,) = observer.outputs[("run_with_rng_state", aten.randperm.default)]
    assert not saved.is_cuda and not again.is_cuda and torch.equal(saved, again)
    assert x.grad.is_cuda and not z.grad.is_cuda
