"""Higher-order operators (flex attention's, torch.cond's) on the emulated device with stream
tracking on: each reaches the tracking mode as one call, a kernel that reads every device tensor it
is given; torch refuses a dispatch mode that does not say it takes them."""

from __future__ import annotations

import pytest
import torch

from harness.emulation.tracking import RaceError


@pytest.fixture
def tracked(cuda_device):
    torch.cuda.Stream()  # the first stream made turns tracking on
    return cuda_device


def _qkv():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, 16, 16, generator=gen).to("cuda") for _ in range(3)]


def test_flex_attention_is_one_tracked_kernel(tracked):
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v = _qkv()
    out = flex_attention(q, k, v)
    assert out.is_cuda
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v))


def test_cond_on_device_tensors(tracked):
    x = torch.arange(4.0, device="cuda")
    out = torch.cond(x.sum() > 0, lambda t: t * 2, lambda t: t - 1, (x,))
    assert out.is_cuda
    torch.testing.assert_close(out, x * 2)


def test_an_unwaited_read_by_flex_attention_is_a_race(tracked):
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v = _qkv()
    flex_attention(q, k, v)  # compiled once, outside the race
    side = torch.cuda.Stream()
    q.mul_(2)  # on the current stream
    with pytest.raises(RaceError, match=r"flex_attention \(a higher-order op\) reads it on stream"):
        with torch.cuda.stream(side):
            flex_attention(q, k, v)
    torch.cuda.synchronize()


def test_a_waited_read_by_flex_attention_is_no_race(tracked):
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v = _qkv()
    side = torch.cuda.Stream()
    q.mul_(2)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = flex_attention(q, k, v)
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v))


@pytest.mark.gpu
@pytest.mark.parametrize("where", ["native", "sanitizer"])
def test_real_streams_see_flex_attention_as_one_kernel(where):
    """Over a real GPU's streams (track_stream_races): the same race, named the same way."""
    import contextlib

    import harness
    from harness.emulation import emulation_active, track_stream_races
    from torch.nn.attention.flex_attention import flex_attention

    if emulation_active() == "cpu" or not torch.cuda.is_available():
        pytest.skip("real streams need a real GPU")
    if where == "native" and emulation_active() is not None:
        pytest.skip("the session is in the graph sanitizer")
    entered = emulation_active() is None and where == "sanitizer"
    if entered:
        pytest.skip("flex attention compiled natively in this process, then called in a sanitizer "
                    "entered later, fails in dynamo (docs/fidelity.md, open); the sanitizer list "
                    "runs this case from inside its session")
    with harness.emulate_cuda() if entered else contextlib.nullcontext():
        q, k, v = _qkv()
        flex_attention(q, k, v)
        side = torch.cuda.Stream()
        with pytest.raises(RaceError, match=r"flex_attention \(a higher-order op\) reads it"):
            with track_stream_races():
                q.mul_(2)
                with torch.cuda.stream(side):
                    flex_attention(q, k, v)
        torch.cuda.synchronize()


def test_cond_inside_a_capture_is_refused_by_name(cuda_device):
    """CUDA refuses it too (the dense torch.cond reads its device predicate on the host, a sync);
    the emulated graph says why it cannot record one, at the user's line."""
    from harness.graphs.base import CaptureError

    # torch's own: once an earlier case compiled torch.cond for other tensors, dynamo's recompile
    # traces into cond's dense kernel and stops ("torch.* op returned non-Tensor"), with or without
    # a capture (seen on the H200, torch 2.11; test_host_sync.py). This case needs a first compile.
    torch._dynamo.reset()
    x = torch.arange(4.0, device="cuda")
    torch.cond(x.sum() > 0, lambda t: t * 2, lambda t: t - 1, (x,))  # compiled before the capture
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(CaptureError, match=r"cond, a higher-order operator .* inside a capture.*"
                                           r"test_higher_order_ops\.py:\d+"):
        with torch.cuda.graph(graph):
            torch.cond(x.sum() > 0, lambda t: t * 2, lambda t: t - 1, (x,))
