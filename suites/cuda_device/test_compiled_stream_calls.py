"""`torch.cuda.current_stream()`, stream contexts, `wait_stream` and events inside a
`torch.compile`d function trace as on CUDA's build, `fullgraph=True` included. Dynamo knows
`torch.cuda.current_stream` and `torch.cuda.stream` by identity and the emulated device replaces
them: until 2026-12-07 dynamo inlined the replacements, and on the CPU wheel (torch 2.13) failed
("StreamVariable() is not a constant"; a stream context in a fullgraph compile: "Unexpected type in
sourceless builder"). The graphs run on the backends that run a graph's stream calls as calls
(eager, aot_eager); inductor's are test_inductor_stream_graphs.py's."""

from __future__ import annotations

import pytest
import torch

BACKENDS = ["eager", "aot_eager"]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _ids(stream) -> tuple[int, int]:
    # which type dynamo hands back (torch.Stream, or CUDA's subclass, which compares unequal to
    # the generic type) is dynamo's; the stream it names is the point
    return stream.stream_id, stream.device_index


@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "breaks_allowed"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_current_stream_is_read_inside_compiled_code(cuda_kind, backend, fullgraph):
    def with_the_stream(t):
        return t + 1, torch.cuda.current_stream()

    x, side = torch.ones(2, device="cuda"), torch.cuda.Stream()
    compiled = torch.compile(with_the_stream, backend=backend, fullgraph=fullgraph)
    out, stream = compiled(x)
    assert out.cpu().tolist() == [2.0, 2.0]
    assert _ids(stream) == _ids(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        assert _ids(compiled(x)[1]) == _ids(side)
    # `side` read `x`, made on the default stream, which frees it: the work done first (a free
    # with the read pending is a race the tracking reports under a session-wide --emulate-cuda)
    torch.cuda.synchronize()


@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "breaks_allowed"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_side_stream_forked_and_joined_inside_compiled_code(cuda_kind, backend, fullgraph):
    def fork_join(t, side):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = t * 2
        torch.cuda.current_stream().wait_stream(side)
        return y + 1

    x, side = torch.ones(4, device="cuda"), torch.cuda.Stream()
    out = torch.compile(fork_join, backend=backend, fullgraph=fullgraph)(x, side)
    assert out.cpu().tolist() == [3.0] * 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stream_made_inside_compiled_code(cuda_kind, backend):
    def on_a_new_stream(t):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            y = t * 2
        torch.cuda.current_stream().wait_stream(s)
        return y + 1

    x = torch.ones(4, device="cuda")
    out = torch.compile(on_a_new_stream, backend=backend, fullgraph=True)(x)
    assert out.cpu().tolist() == [3.0] * 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_events_recorded_and_waited_inside_compiled_code(cuda_kind, backend):
    def with_events(t):
        event = torch.cuda.Event()
        event.record()
        y = t * 3
        event.wait()
        torch.cuda.current_stream().record_event().synchronize()
        return y

    x = torch.ones(4, device="cuda")
    out = torch.compile(with_events, backend=backend, fullgraph=True)(x)
    assert out.cpu().tolist() == [3.0] * 4


def test_the_current_stream_of_a_tensors_device(cuda_kind):
    def of_its_device(t):
        return t + 1, torch.cuda.current_stream(t.device)

    x = torch.ones(2, device="cuda")
    out, stream = torch.compile(of_its_device, backend="eager", fullgraph=True)(x)
    assert _ids(stream) == _ids(torch.cuda.current_stream()) and out.is_cuda


class _Box:
    def __init__(self, value):
        self.value = value


def test_streams_and_events_made_in_compiled_code_after_dynamo_ran_outside(outside_emulation):
    # dynamo builds its set of in-graph classes at its first class call: here outside the
    # emulation, so it holds torch's own stream and event classes (CI's test order did this)
    import harness

    torch._dynamo.reset()
    torch.compile(lambda t: _Box(t).value + 1, fullgraph=True, backend="eager")(torch.ones(2))

    def fork(t):
        side = torch.cuda.Stream()
        done = torch.cuda.Event()
        with torch.cuda.stream(side):
            y = t * 2
            done.record()
        torch.cuda.current_stream().wait_event(done)
        return y + 1

    with harness.emulate_cuda(device="cpu"):
        x = torch.ones(2, device="cuda")
        out = torch.compile(fork, fullgraph=True, backend="eager")(x)
        assert out.tolist() == [3.0, 3.0] and out.is_cuda
    torch._dynamo.reset()
