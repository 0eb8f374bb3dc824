"""`torch.cuda.ExternalStream` over a handle that names a stream torch made (an application handing
`stream.cuda_stream` back: OpenMM's context stream, Warp's `stream_from_torch`, a C++ extension)
is that stream to CUDA: one cudaStream_t, whose work runs in issue order and joins its capture. The
emulated device took each wrapper for a stream of its own, so stream tracking reported a race
between the two and the wrapper's work escaped the stream's capture. As on CUDA, the wrapper is
still another stream object to torch (unequal, a stream id of its own). The rows run natively on a
GPU too, and under the graph sanitizer, whose real-stream tracking keys on the handle."""

from __future__ import annotations

import torch

from harness.emulation import emulation_active, track_stream_races


def _tracked():
    # Stream tracking where the harness tracks streams; plain CUDA natively.
    import contextlib

    return track_stream_races() if emulation_active() is not None else contextlib.nullcontext()


def test_work_on_a_wrapper_of_a_torch_streams_handle_is_ordered_with_the_stream(cuda_kind):
    app = torch.cuda.Stream()
    x = torch.zeros(1 << 12, device="cuda")
    torch.cuda.synchronize()
    with _tracked():
        with torch.cuda.stream(app):
            x.fill_(2.0)  # the application's write on its stream
        wrapped = torch.cuda.ExternalStream(app.cuda_stream)
        with torch.cuda.stream(wrapped):
            y = x * 3  # the same queue: after the write, no wait needed
            again = torch.cuda.ExternalStream(app.cuda_stream)
        with torch.cuda.stream(again):
            y.add_(1)
        wrapped.synchronize()
        torch.cuda.current_stream().wait_stream(app)
    assert wrapped.cuda_stream == again.cuda_stream == app.cuda_stream
    # Another stream object to torch (its id comes from the handle), the same queue to CUDA.
    assert wrapped != app and wrapped.stream_id != app.stream_id and wrapped == again
    assert y.tolist() == [7.0] * (1 << 12)


def test_work_on_a_wrapper_of_the_capturing_stream_is_captured(cuda_kind):
    side = torch.cuda.Stream()
    x = torch.ones(8, device="cuda")
    out = torch.zeros(8, device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        wrapped = torch.cuda.ExternalStream(side.cuda_stream)
        with torch.cuda.stream(wrapped):
            assert torch.cuda.current_stream() == wrapped != side
            assert torch.cuda.is_current_stream_capturing()
            out.copy_(x * 5)
    x.fill_(2.0)
    graph.replay()
    torch.cuda.synchronize()
    assert out.tolist() == [10.0] * 8


def test_the_current_stream_inside_a_wrapper_is_a_new_plain_stream_of_its_id(cuda_kind):
    """torch.cuda.current_stream() builds a new `torch.cuda.Stream` from the c10 stream's ids at
    each call (torch/cuda/__init__.py), so inside a wrapper's stream context it is not the
    ExternalStream made current but a plain Stream equal to it, with its handle and priority; the
    emulated device handed back the wrapper object itself."""
    app = torch.cuda.Stream(priority=-1)
    wrapped = torch.cuda.ExternalStream(app.cuda_stream)
    for entered in (torch.cuda.stream(wrapped), wrapped):  # the stream context, or the stream itself
        with entered:
            current = torch.cuda.current_stream()
            generic = torch.accelerator.current_stream()
        assert type(current) is torch.cuda.Stream and current is not wrapped
        assert current == wrapped and wrapped == current and current != app
        assert (current.stream_id, current.cuda_stream, current.priority) == (
            wrapped.stream_id, app.cuda_stream, app.priority)
        assert isinstance(generic, torch.Stream) and not isinstance(generic, torch.cuda.Stream)
        assert generic.stream_id == wrapped.stream_id
    assert torch.cuda.current_stream() is not torch.cuda.current_stream()
    assert torch.cuda.default_stream() is not torch.cuda.default_stream()
    assert type(torch.cuda.get_stream_from_external(app.cuda_stream)) is torch.cuda.Stream


def test_a_wrapper_of_a_null_handle_is_a_new_pooled_stream(cuda_kind):
    """torch's Stream constructor reads `stream_ptr=0` as none given and takes a stream from
    CUDA's pool (THCPStream_pynew: getStreamFromPool): `ExternalStream(0).cuda_stream` is that
    stream's own nonzero handle (measured on an H100, torch 2.11: 0x3c7d2a40), not 0, and the
    wrapper is not the default stream. The emulated device answered 0."""
    wrapper = torch.cuda.ExternalStream(0)
    handle = wrapper.cuda_stream
    assert handle != 0 and wrapper.cuda_stream == handle  # the same handle on each read
    assert wrapper != torch.cuda.default_stream() and wrapper.stream_id != 0
    assert wrapper.priority == 0
    # a plain Stream of its ids is the same stream, the handle its own
    same = torch.cuda.Stream(stream_id=wrapper.stream_id, device_index=wrapper.device_index,
                             device_type=wrapper.device_type)
    assert same == wrapper and same.cuda_stream == handle
    x = torch.ones(4, device="cuda")
    wrapper.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(wrapper):
        y = x * 3
    wrapper.synchronize()
    assert y.tolist() == [3.0] * 4
