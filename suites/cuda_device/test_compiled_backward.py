"""Training through `torch.compile` on the emulated CUDA device (harness/emulation/
compiled_training.py): AOTAutograd's forward and backward graphs each run as a graph of the device,
gradients equal eager's in every mode, and under reduce-overhead both replay through the device's
CUDA graphs, as cudagraph trees replay a forward node and a backward node. The `cuda_kind` rows
run natively on a GPU to show CUDA's answer."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice

MODES = [None, "reduce-overhead", "max-autotune-no-cudagraphs"]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _refused_in_the_sanitizer(cuda_kind, mode):
    """The graph sanitizer refuses inductor's CUDA graphs by name (sanitizer.py)."""
    if cuda_kind != "sanitizer" or mode != "reduce-overhead":
        return contextlib.nullcontext()
    return pytest.raises(UnsupportedOnEmulatedDevice, match="cudagraph trees")


def _models():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 4)).cuda()
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 4)).cuda()
    reference.load_state_dict(model.state_dict())
    return model, reference


def _step(model, x):
    loss = model(x).square().mean()
    loss.backward()
    return loss.detach().clone()


@pytest.mark.parametrize("mode", MODES)
def test_a_compiled_training_step_gives_eagers_gradients(cuda_kind, mode):
    """Until 2026-12-06 a compiled model's `loss.backward()` failed on the emulated device in
    every mode: the compiled backward ran inductor's code with the device's placement mode on the
    stack (a mixed-device error on its saved activations), on the CUDA wheel without a GPU it was
    compiled lazily for Triton ("libcuda.so cannot found"), and under stream tracking or
    reduce-overhead the forward was refused as one op without a backward."""
    model, reference = _models()
    compiled = torch.compile(model, mode=mode)
    with _refused_in_the_sanitizer(cuda_kind, mode):
        for _ in range(4):  # warm-up, recording and replays under reduce-overhead
            x = torch.rand(4, 8, device="cuda")
            if mode == "reduce-overhead":
                # only where the trees run: torch's reset zeroes the mark count there alone, and
                # a count left behind keeps a later test's trees in one generation
                torch.compiler.cudagraph_mark_step_begin()
            loss = _step(compiled, x)
            torch.testing.assert_close(loss, _step(reference, x))
            for p, q in zip(model.parameters(), reference.parameters()):
                assert p.grad.is_cuda
                torch.testing.assert_close(p.grad, q.grad)
                p.grad, q.grad = None, None


def test_reduce_overhead_replays_the_forward_and_the_backward_graph(cuda_kind):
    """Cudagraph trees record AOTAutograd's forward and its backward as two nodes; after the
    warm-up and the recording, a training step is two graph launches."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's CUDA graphs by name")
    model, reference = _models()
    compiled = torch.compile(model, mode="reduce-overhead")
    x = torch.rand(4, 8, device="cuda")
    for _ in range(2):  # warm-up, recording
        torch.compiler.cudagraph_mark_step_begin()
        _step(compiled, x)
        # the gradients are the backward graph's outputs in the trees' pool: accumulating into
        # them at the next step raises the trees' overwritten error natively (H100, 2026-12-06)
        for p in model.parameters():
            p.grad = None
    torch.compiler.cudagraph_mark_step_begin()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        _step(compiled, x)
        torch.cuda.synchronize()
    assert [e.name for e in prof.events()].count("cudaGraphLaunch") == 2
    _step(reference, x)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_a_replayed_output_that_views_an_input_stays_on_autograds_path(cuda_kind):
    """AOTAutograd compiles `x[2:]` of an input that requires grad for inference and rebuilds the
    output as a view of the caller's tensor around the compiled code; a replay returned a view of
    the recording's copy of the input before 2026-12-06 (no grad_fn: backward raised)."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's CUDA graphs by name")
    compiled = torch.compile(lambda x: x[2:], mode="reduce-overhead")
    for _ in range(3):  # warm-up, recording, replay
        leaf = torch.rand(6, 3, device="cuda", requires_grad=True)
        y = leaf * 2
        torch.compiler.cudagraph_mark_step_begin()
        out = compiled(y)
        assert out.data_ptr() == y[2:].data_ptr()
        (out * out).sum().backward()
        expected = torch.zeros(6, 3, device="cuda")
        expected[2:] = 8 * leaf.detach()[2:]
        torch.testing.assert_close(leaf.grad, expected)


def test_a_training_step_runs_under_strict_stream_tracking(cuda_device):
    """Under stream tracking a compiled graph is one device op; a forward autograd must
    differentiate was refused so until 2026-12-06. Now the forward and the backward are each one
    op, ordered on the current stream as any op (no race reported)."""
    model, reference = _models()
    compiled = torch.compile(model)
    x = torch.rand(4, 8, device="cuda")
    torch.testing.assert_close(_step(compiled, x), _step(reference, x))
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_training_after_dynamo_reset_recompiles_both_graphs(cuda_device):
    """AOTAutograd's cache would serve the second compile of the same model from inductor's cache
    without calling `compile_fx_inner`, so its backward would run as the compiled code is: it is
    off inside the emulation, and the second compile trains as the first."""
    model, reference = _models()
    x = torch.rand(4, 8, device="cuda")
    for _ in range(2):
        torch._dynamo.reset()
        compiled = torch.compile(model)
        torch.testing.assert_close(_step(compiled, x), _step(reference, x))
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
            p.grad, q.grad = None, None


class _Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 3 * x * x


def test_a_python_backward_meets_the_implicit_gradient_on_the_device(cuda_kind):
    """`loss.backward()` makes the gradient of `loss` itself (`ones_like`) where the device's
    placement mode is off the stack: it was host memory until 2026-12-06, and a Python backward
    (a custom autograd.Function's, AOTAutograd's under aot_eager) that multiplied it with a saved
    device tensor raised CUDA's mixed-device error."""
    x = torch.rand(5, device="cuda", requires_grad=True)
    _Cube.apply(x).sum().backward()
    torch.testing.assert_close(x.grad, 3 * x.detach() ** 2)


@pytest.mark.parametrize("backend", ["aot_eager", "cudagraphs"])
def test_training_through_a_backend_of_eager_ops_gives_eagers_gradients(cuda_kind, backend):
    """Backends whose AOTAutograd graphs are torch calls run them as the device's eager ops when
    autograd must differentiate them (dynamo's cudagraphs backend without the device's graphs:
    counted on the DeviceGraph, `differentiated_op_by_op`)."""
    if cuda_kind == "sanitizer" and backend == "cudagraphs":
        pytest.skip("the graph sanitizer refuses cudagraph trees by name")
    model, reference = _models()
    compiled = torch.compile(model, backend=backend)
    for _ in range(3):
        x = torch.rand(4, 8, device="cuda")
        torch.testing.assert_close(_step(compiled, x), _step(reference, x))
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
            p.grad, q.grad = None, None


@pytest.mark.skipif(not hasattr(torch._C, "_set_storage_data_ptr_access_error_msg"),
                    reason="this torch (a CPU wheel) cannot make a storage raise on access")
def test_gradients_accumulated_into_the_last_steps_raise_as_pool_outputs(cuda_kind):
    """The gradients a reduce-overhead backward returns are outputs in the trees' pool, and
    autograd keeps them as `.grad`: accumulating into them at the next step reads memory the new
    generation owns, which raises natively (H100, torch 2.11, 2026-12-06). The emulated device let
    it through until the trees' generations followed storages: autograd keeps the gradient under a
    new Python object, so a reference to the one the backward returned died."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's CUDA graphs by name")
    model, _ = _models()
    compiled = torch.compile(model, mode="reduce-overhead")
    x = torch.rand(4, 8, device="cuda")
    torch.compiler.cudagraph_mark_step_begin()
    _step(compiled, x)
    torch.compiler.cudagraph_mark_step_begin()
    with pytest.raises(RuntimeError, match="overwritten by a subsequent run"):
        _step(compiled, x)


def _a_factory_and_a_copy_to_the_host(y):
    x = torch.zeros(3, device="cuda")
    x.add_(3)
    z = x * y
    return z, z.cpu() * 2


def _a_factory_on_the_inputs_device(y):
    x = torch.full((3,), 3.0, device=y.device)  # traced on the cpu: the device's `.device`
    z = x * y
    return z, z.cpu() * 2


@pytest.mark.parametrize("fn", [_a_factory_and_a_copy_to_the_host,
                                _a_factory_on_the_inputs_device])
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "cudagraphs"])
def test_a_graph_of_eager_ops_keeps_its_transfers_when_differentiated(cuda_kind, backend, fn):
    """A factory naming cuda and a copy to the host inside a graph autograd differentiates, through
    a backend of torch calls (dynamo's `backend="cudagraphs"` in PyTorch's test/dynamo/
    test_cudagraphs.py `test_factory`). The device traces a transfer as a marker that AOTAutograd
    traces into an alias, and its graphs ran as the device's eager ops: the factory's tensor stayed
    host memory and its product with a device tensor raised CUDA's mixed-device error (until
    2026-12-06), and the copy to the host came back as device memory."""
    if cuda_kind == "sanitizer" and backend == "cudagraphs":
        pytest.skip("the graph sanitizer refuses cudagraph trees by name")
    compiled = torch.compile(fn, backend=backend)
    for _ in range(3):
        y = torch.rand(3, device="cuda", requires_grad=True)
        z, host = compiled(y)
        assert (z.device.type, host.device.type) == ("cuda", "cpu")
        (z.sum() + host.sum()).backward()
        torch.testing.assert_close(y.grad, torch.full((3,), 9.0, device="cuda"))
