"""Users' custom ops whose Python body moves memory (`.cpu()`, `.cuda()`, a factory naming cuda)
on the emulated CUDA device (harness/emulation/op_bodies.py): their bodies see the device eagerly
and inside compiled graphs, as on CUDA. Until 2026-12-06 a body ran with the device's placement
mode off the stack, so `.cuda()` reached torch's own CUDA runtime ("Found no NVIDIA driver").
The `cuda_kind` rows run natively on a GPU to show CUDA's answer."""

from __future__ import annotations

import itertools

import pytest
import torch

_NAMES = itertools.count()
SEEN: list[tuple[bool, bool]] = []  # per body call: (the argument is cuda, its .cpu() is not)


# Defined at import: before the emulation enters in a plain run, inside it under --emulate-cuda.
@torch.library.custom_op("harness_test_bodies::round_trip", mutates_args=())
def round_trip(pic: torch.Tensor) -> torch.Tensor:
    img = pic.cpu()
    SEEN.append((pic.is_cuda, not img.is_cuda))
    return ((img + 1) * 2).cuda() / 4


@round_trip.register_fake
def _(pic):
    return torch.empty_like(pic)


def _expected(x: torch.Tensor) -> torch.Tensor:
    return ((x.cpu() + 1) * 2 / 4).to(x.device)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    SEEN.clear()
    yield
    torch._dynamo.reset()


def test_a_custom_ops_body_sees_the_device_eagerly(cuda_kind):
    x = torch.rand(3, 4, device="cuda")
    out = round_trip(x)
    assert out.is_cuda
    assert SEEN == [(True, True)]
    torch.testing.assert_close(out, _expected(x))


def test_a_custom_ops_body_sees_the_device_inside_a_compiled_graph(cuda_kind):
    """The body gets the graph's intermediate buffer, which CUDA allocates on the device."""
    compiled = torch.compile(lambda x: round_trip(x * 2) + 1, fullgraph=True)
    x = torch.rand(3, 4, device="cuda")
    out = compiled(x)
    assert out.is_cuda
    assert SEEN == [(True, True)]
    torch.testing.assert_close(out, _expected(x * 2) + 1)


def test_a_custom_op_given_cuda_as_its_device_argument(cuda_kind):
    """A factory op of the user's, registered while the device is in use, called with "cuda"
    positionally eagerly and from compiled code: device memory both times."""
    name = f"harness_test_bodies::filled_{next(_NAMES)}"

    @torch.library.custom_op(name, mutates_args=())
    def filled(n: int, device: torch.device) -> torch.Tensor:
        out = torch.zeros((n,), device=device)
        out[1:] = 2.0
        return out

    @filled.register_fake
    def _(n, device):
        return torch.empty((n,), device=device)

    x = torch.rand(4, device="cuda")
    eager = filled(4, "cuda") + x
    compiled = torch.compile(lambda x: filled(x.shape[0], "cuda") + x, fullgraph=True)(x)
    assert eager.is_cuda and compiled.is_cuda
    torch.testing.assert_close(compiled, eager)


@pytest.mark.parametrize("partition", [True, False])
def test_a_cudagraph_unsafe_custom_op_under_reduce_overhead(cuda_kind, partition):
    """A body that syncs with the host, tagged cudagraph_unsafe: inductor runs it outside the
    CUDA graphs (graph partition) or skips the graphs; each call computes what eager does."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's cudagraph trees by name")
    name = f"harness_test_bodies::unsafe_{next(_NAMES)}"

    @torch.library.custom_op(name, mutates_args=(), tags=(torch._C.Tag.cudagraph_unsafe,))
    def unsafe(pic: torch.Tensor) -> torch.Tensor:
        return ((pic.cpu() + 1) * 2).cuda() + pic

    @unsafe.register_fake
    def _(pic):
        return torch.empty_like(pic)

    def f(x):
        return unsafe(x * 2) + 1

    from torch._dynamo.utils import counters

    counters.clear()
    x = torch.rand(3, 4, device="cuda")
    with torch._inductor.config.patch(graph_partition=partition):
        compiled = torch.compile(f, mode="reduce-overhead", fullgraph=True)
        for _ in range(3):
            x.copy_(torch.rand(3, 4, device="cuda"))
            torch.testing.assert_close(compiled(x), f(x))
    # inductor skips the CUDA graphs for it without partitions ("incompatible op"), and counts it
    assert counters["inductor"]["cudagraph_skips"] == (0 if partition else 1)
