"""The zero gradient autograd's engine makes for an output the loss does not use is on that
output's device (harness/emulation/backward.py), as CUDA's engine makes it: a custom
`autograd.Function`'s backward, AOTAutograd's among them, combines it with the other gradients.
The `cuda_kind` and `two_devices` rows run natively on GPUs to show CUDA's answer."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class _TwoOutputs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2, x * 3

    @staticmethod
    def backward(ctx, grad_a, grad_b):
        ctx.seen = (grad_a.device, grad_b.device)
        return grad_a * 2 + grad_b * 3


def test_an_unused_outputs_zero_gradient_is_on_the_device(cuda_kind):
    x = torch.ones(3, device="cuda", requires_grad=True)
    a, _ = _TwoOutputs.apply(x)
    node = a.grad_fn
    a.sum().backward()
    assert node.seen == (torch.device("cuda", 0), torch.device("cuda", 0))
    assert x.grad.is_cuda and x.grad.tolist() == [2.0] * 3


def _side_stream_made(made: bool) -> None:
    """A stream made before the check: the emulated device then tracks every op's stream (it
    starts at the first sign of asynchrony), whose mode marks each fresh result of a device call,
    the engine's zero gradients too. Until 2026-12-07 they were then cuda:0's, on its stream,
    whatever the output's device (PyTorch's TestSAC.test_multi_device failed after any case that
    had made a stream: a mixed-device error)."""
    if made:
        torch.cuda.Stream(device=0)


@pytest.mark.parametrize("stream_made", [False, True], ids=["default_stream", "after_a_stream"])
def test_an_unused_outputs_zero_gradient_is_on_that_outputs_device(two_devices, stream_made):
    _side_stream_made(stream_made)

    class Across(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            return x * 2, y * 3

        @staticmethod
        def backward(ctx, grad_a, grad_b):
            ctx.seen = (grad_a.device, grad_b.device)
            return grad_a * 2, grad_b * 3

    x = torch.ones(2, device="cuda:0", requires_grad=True)
    y = torch.ones(2, device="cuda:1", requires_grad=True)
    a, _ = Across.apply(x, y)
    node = a.grad_fn
    a.sum().backward()
    assert node.seen == (torch.device("cuda", 0), torch.device("cuda", 1))
    assert y.grad is None or y.grad.device == torch.device("cuda", 1)


@pytest.mark.parametrize("stream_made", [False, True], ids=["default_stream", "after_a_stream"])
def test_a_compiled_function_of_two_devices_differentiates_one_output(two_devices, stream_made):
    """PyTorch's TestSAC.test_multi_device: AOTAutograd's backward combines the zero gradient of
    the unused output with the gradients on its device."""
    _side_stream_made(stream_made)

    def region(x, y):
        return torch.sigmoid(torch.rand_like(x) * y) * x

    def fn(x, y):
        return torch.sin(torch.utils.checkpoint.checkpoint(region, torch.sin(x), y,
                                                           use_reentrant=True))

    def both(x, y, a, b):
        return fn(x, y), fn(a, b)

    x, y = (torch.randn(4, 4, device="cuda:0", requires_grad=True) for _ in range(2))
    a, b = (torch.randn(4, 4, device="cuda:1", requires_grad=True) for _ in range(2))
    out = torch.compile(both, backend="aot_eager_decomp_partition")(x, y, a, b)
    out[0].sum().backward()
    assert x.grad.device == torch.device("cuda", 0)
    # one compiled Function for both: the unused half's gradients are zeros, on their device
    assert a.grad is None or (a.grad.device == torch.device("cuda", 1) and not a.grad.any())
