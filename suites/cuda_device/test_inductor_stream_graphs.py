"""Graphs with stream contexts, waits and events compiled by inductor, in each mode.

Dynamo keeps `with torch.cuda.stream(s):`, `wait_stream` and events in the graph (torch 2.11 on);
on CUDA inductor writes each stream's nodes inside a block of that stream. The emulated device's
graphs are cpu graphs, where until 2026-12-07 inductor's code failed when it ran ("NameError: name
'stream1' is not defined", or `default_stream`; "UnboundLocalError: cannot access local variable
'arg0_1'" with an event in the graph). The emulated device now runs the stream calls around the
graph's one op (compiled_stream_nodes.py); the rows with `cuda_device` check the race tracking's
verdicts around such a graph, each beside the planted bug it must report."""

from __future__ import annotations

import pytest
import torch

from harness.emulation.tracking import RaceError

MODES = {"default": {}, "reduce-overhead": {"mode": "reduce-overhead"},
         "max-autotune-no-cudagraphs": {"mode": "max-autotune-no-cudagraphs"},
         "fullgraph": {"fullgraph": True}}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _current():
    return torch.cuda.current_stream()


def matmul_on_a_side_stream(x, w, side):
    side.wait_stream(_current())
    with torch.cuda.stream(side):
        y = x @ w
    _current().wait_stream(side)
    return y.relu() + x


def pointwise_on_a_side_stream(x, w, side):
    side.wait_stream(_current())
    with torch.cuda.stream(side):
        y = x * 2
    _current().wait_stream(side)
    return y + w


def two_side_streams(x, w, side):
    other = torch.cuda.Stream()
    side.wait_stream(_current())
    other.wait_stream(_current())
    with torch.cuda.stream(side):
        y = x @ w
    with torch.cuda.stream(other):
        z = x + 3
    _current().wait_stream(side)
    _current().wait_stream(other)
    return y + z


def events_recorded_and_waited(x, w, side):
    start = torch.cuda.Event()
    start.record()
    with torch.cuda.stream(side):
        start.wait()
        y = x @ w
        done = torch.cuda.Event()
        done.record()
    done.wait()
    return y * 2


def a_streams_own_event(x, w, side):
    side.wait_stream(_current())
    with torch.cuda.stream(side):
        y = x + w
        done = side.record_event()
    _current().wait_event(done)
    return y * 3


def an_event_on_the_current_stream(x, w, side):
    event = torch.cuda.Event()
    event.record()
    y = x * 3
    event.wait()
    return y + w


SHAPES = [matmul_on_a_side_stream, pointwise_on_a_side_stream, two_side_streams,
          events_recorded_and_waited, a_streams_own_event, an_event_on_the_current_stream]


def _skip_the_sanitizers_graphs(cuda_kind, mode: str) -> None:
    if cuda_kind == "sanitizer" and mode == "reduce-overhead":
        pytest.skip("the graph sanitizer refuses inductor's CUDA graphs by name")


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("shape", SHAPES, ids=[f.__name__ for f in SHAPES])
def test_a_graph_with_streams_gives_eagers_values(cuda_kind, shape, mode):
    _skip_the_sanitizers_graphs(cuda_kind, mode)
    x = torch.randn(8, 8, device="cuda")
    w = torch.randn(8, 8, device="cuda")
    side = torch.cuda.Stream()
    expected = shape(x, w, side)
    compiled = torch.compile(shape, **MODES[mode])
    for _ in range(3):  # warm-up, recording and replay under reduce-overhead
        out = compiled(x, w, side)
        torch.cuda.synchronize()
        assert out.is_cuda
        torch.testing.assert_close(out, expected)


def test_a_backend_of_ones_own_compiles_a_graph_with_streams_by_compile_fx(cuda_kind):
    """A runtime's backend hands dynamo's graph to inductor's `compile_fx` itself."""
    from torch._inductor.compile_fx import compile_fx

    def own_backend(gm, example_inputs):
        return compile_fx(gm, example_inputs)

    x = torch.randn(8, 8, device="cuda")
    w = torch.randn(8, 8, device="cuda")
    side = torch.cuda.Stream()
    compiled = torch.compile(events_recorded_and_waited, backend=own_backend)
    for _ in range(2):
        out = compiled(x, w, side)
        torch.cuda.synchronize()
        torch.testing.assert_close(out, events_recorded_and_waited(x, w, side))


def test_a_graph_with_streams_is_captured_and_replayed(cuda_kind):
    """The graph's side stream is forked into a capture and joined back by the graph's own waits;
    a replay reruns both streams' work."""
    if cuda_kind == "sanitizer":
        pytest.skip("inductor's stream blocks inside the graph sanitizer's capture: not known")
    compiled = torch.compile(matmul_on_a_side_stream)
    x = torch.randn(8, 8, device="cuda")
    w = torch.randn(8, 8, device="cuda")
    side = torch.cuda.Stream()
    compiled(x, w, side)  # compiled outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = compiled(x, w, side)
    x.copy_(torch.randn(8, 8, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, matmul_on_a_side_stream(x, w, side))


def _prefetch_and_bump(host, device, side):
    side.wait_stream(_current())
    with torch.cuda.stream(side):
        keys = host.to("cuda", non_blocking=True)
    _current().wait_stream(side)
    keys.add_(1)
    return keys * device


@pytest.mark.parametrize("mode", list(MODES))
def test_a_non_blocking_copy_in_a_stream_context_is_a_new_tensor(cuda_kind, mode):
    """On CUDA the prefetched keys are device memory of their own: bumping them leaves the pinned
    source as it was. On the emulated device the move stayed a view of the source until
    2026-12-07, and the bump wrote it."""
    _skip_the_sanitizers_graphs(cuda_kind, mode)
    compiled = torch.compile(_prefetch_and_bump, **MODES[mode])
    device, side = torch.full((4,), 2.0, device="cuda"), torch.cuda.Stream()
    for step in range(3):
        host = torch.full((4,), float(step)).pin_memory()
        out = compiled(host, device, side)
        torch.cuda.synchronize()
        assert host.tolist() == [float(step)] * 4
        assert out.is_cuda and out.cpu().tolist() == [2.0 * (step + 1)] * 4


# --- the race tracking around a graph inductor compiled (emulated device only) ---------------

def _side_work_left_unjoined(x, side):
    side.wait_stream(_current())
    with torch.cuda.stream(side):
        y = x * 2
    return y


def test_work_on_a_graphs_stream_after_it_reads_its_output(cuda_device):
    """The graph's work on `side` is followed on `side`: CUDA orders the two by the stream."""
    x, side = torch.ones(4, device="cuda"), torch.cuda.Stream()
    y = torch.compile(_side_work_left_unjoined)(x, side)
    with torch.cuda.stream(side):
        z = y + 1
    torch.cuda.synchronize()
    assert z.cpu().tolist() == [3.0] * 4


def test_an_event_recorded_in_a_graph_orders_its_waiter(cuda_device):
    def record_after_work(x, side, done):
        side.wait_stream(_current())
        with torch.cuda.stream(side):
            y = x * 2
            done.record(side)
        return y

    x, side, reader = torch.ones(4, device="cuda"), torch.cuda.Stream(), torch.cuda.Stream()
    done = torch.cuda.Event()
    compiled = torch.compile(record_after_work)
    y = compiled(x, side, done)
    with torch.cuda.stream(reader):
        reader.wait_event(done)
        z = y + 1
    torch.cuda.synchronize()
    assert z.cpu().tolist() == [3.0] * 4
    # the planted bug: a reader on a third stream that waits for nothing
    y = compiled(x, side, done)
    with pytest.raises(RaceError, match="streams touching the same memory"):
        with torch.cuda.stream(torch.cuda.Stream()):
            y + 1
    torch.cuda.synchronize()  # `x`, read on `side`, is freed on the current stream at the end


def test_a_wait_at_a_graphs_start_orders_it_after_a_side_streams_write(cuda_device):
    def wait_then_read(x):
        _current().wait_stream(side)
        return x * 2

    def read_without_waiting(x):
        return x * 2

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.ones(4, device="cuda") + 1
    out = torch.compile(wait_then_read)(x)
    torch.cuda.synchronize()
    assert out.cpu().tolist() == [4.0] * 4
    with torch.cuda.stream(side):
        x = torch.ones(4, device="cuda") + 1
    with pytest.raises(RaceError, match="streams touching the same memory"):
        torch.compile(read_without_waiting)(x)


def _written_on_a_side_stream(side):
    with torch.cuda.stream(side):
        written = torch.ones(4, device="cuda") + 1
        return written, side.record_event()


def test_a_host_sync_inside_a_graph_orders_the_work_after_it(cuda_device):
    """The host waits for an event after some of the graph's work: on CUDA the graph's later work
    is launched after what the event marks."""
    def sync_between(x, written, done):
        doubled = x * 2
        done.synchronize()
        return doubled + written

    def no_sync(x, written, done):
        return x * 2 + written

    side, x = torch.cuda.Stream(), torch.ones(4, device="cuda")
    out = torch.compile(sync_between)(x, *_written_on_a_side_stream(side))
    torch.cuda.synchronize()
    assert out.cpu().tolist() == [4.0] * 4
    # the planted bug: no sync between the side stream's write and the graph's read
    with pytest.raises(RaceError, match="streams touching the same memory"):
        torch.compile(no_sync)(x, *_written_on_a_side_stream(side))


# --- races between a graph's own streams (the graph's pieces on their streams) ----------------

TRACKED_MODES = [m for m in MODES if m != "reduce-overhead"]


def _side_result_read_without_a_wait(x, side):
    side.wait_stream(_current())
    with torch.cuda.stream(side):
        y = x @ x
    return y + 1


def _side_result_read_after_a_wait(x, side):
    side.wait_stream(_current())
    with torch.cuda.stream(side):
        y = x @ x
    _current().wait_stream(side)
    return y + 1


@pytest.mark.parametrize("mode", TRACKED_MODES)
def test_a_side_streams_result_read_without_a_wait_is_a_race(cuda_device, mode):
    """Inductor writes the side stream's matmul inside its stream block and the add on the
    current stream, with no wait of its own between them: a race on CUDA, as in eager code. The
    emulated device ran the whole graph as one op on the current stream and reported nothing
    (until 2026-12-08)."""
    x, side = torch.ones(4, 4, device="cuda"), torch.cuda.Stream()
    with pytest.raises(RaceError, match="streams touching the same memory"):
        _side_result_read_without_a_wait(x, side)  # eager code's verdict
    torch.cuda.synchronize()
    with pytest.raises(RaceError, match="streams touching the same memory"):
        torch.compile(_side_result_read_without_a_wait, **MODES[mode])(x, side)
    torch.cuda.synchronize()  # `x`, read on `side`, is freed on the current stream at the end


@pytest.mark.parametrize("mode", TRACKED_MODES)
def test_a_side_streams_result_read_after_a_wait_is_quiet(cuda_device, mode):
    x, side = torch.ones(4, 4, device="cuda"), torch.cuda.Stream()
    compiled = torch.compile(_side_result_read_after_a_wait, **MODES[mode])
    for _ in range(2):
        out = compiled(x, side)
        torch.cuda.synchronize()
        assert out.cpu().tolist() == [[5.0] * 4] * 4


def _side_reads_without_forking(x, side):
    with torch.cuda.stream(side):
        y = x * 2
    _current().wait_stream(side)
    return y


def test_a_side_stream_reading_the_current_streams_write_without_a_wait_is_a_race(cuda_device):
    """The graph's side stream reads what the current stream wrote just before the call, without
    `side.wait_stream(current)`: unordered on CUDA."""
    side = torch.cuda.Stream()
    x = torch.ones(4, device="cuda") + 1
    with pytest.raises(RaceError, match="streams touching the same memory"):
        torch.compile(_side_reads_without_forking)(x, side)
    torch.cuda.synchronize()
    x = torch.ones(4, device="cuda") + 1
    out = torch.compile(_side_result_read_after_a_wait)(x.reshape(2, 2), side)  # it forks first
    torch.cuda.synchronize()
    assert out.cpu().tolist() == [[9.0, 9.0], [9.0, 9.0]]


def test_the_aot_eager_backend_runs_the_graph_on_the_current_stream(cuda_device):
    """aot_eager runs AOTAutograd's graph as fx code, which does not read the nodes' stream marks
    (torch/fx/graph.py writes no stream switch): on CUDA every node runs on the current stream,
    so the missing wait is no race there, and the emulated device reports none."""
    x, side = torch.ones(4, 4, device="cuda"), torch.cuda.Stream()
    out = torch.compile(_side_result_read_without_a_wait, backend="aot_eager")(x, side)
    torch.cuda.synchronize()
    assert out.cpu().tolist() == [[5.0] * 4] * 4


def _record_and_return(x, side):
    side.wait_stream(_current())
    with torch.cuda.stream(side):
        y = x * 2
        done = side.record_event()
    return y, done


def test_an_event_a_graph_records_and_returns_orders_its_waiter(cuda_device):
    """`side.record_event()` in the graph records, at each call, the event the call returns. On
    torch 2.11 dynamo hands back the event it made while tracing, and the graph's call made
    another: a reader waiting on the returned one was not ordered after the side stream's work
    (until 2026-12-08)."""
    x, side, reader = torch.ones(4, device="cuda"), torch.cuda.Stream(), torch.cuda.Stream()
    compiled = torch.compile(_record_and_return)
    for _ in range(2):
        y, done = compiled(x, side)
        with torch.cuda.stream(reader):
            reader.wait_event(done)
            z = y + 1
        torch.cuda.synchronize()
        assert z.cpu().tolist() == [3.0] * 4
    y, done = compiled(x, side)
    with pytest.raises(RaceError, match="streams touching the same memory"):
        with torch.cuda.stream(reader):
            y + 1  # the planted bug: no wait on `done`
    torch.cuda.synchronize()


def test_a_wait_on_an_event_the_graph_recorded_orders_the_current_stream(cuda_device):
    """`current.wait_event(side.record_event())` inside the graph (torch 2.11: a method call
    whose result the wait reads, which stayed in the graph and ran only while AOTAutograd
    traced)."""
    x, w, side = torch.ones(4, 4, device="cuda"), torch.ones(4, 4, device="cuda"), \
        torch.cuda.Stream()
    compiled = torch.compile(a_streams_own_event)
    for _ in range(2):
        out = compiled(x, w, side)
        torch.cuda.synchronize()
        assert out.cpu().tolist() == [[6.0] * 4] * 4


def _doubled_and_queried(x, side):
    return x * 2, side.query()


def test_a_streams_query_in_compiled_code_is_its_answer_while_dynamo_traced(cuda_kind):
    """Dynamo keeps `stream.query()` in the graph with the answer it got while tracing as the
    value the code reads (torch 2.11, 2.13 and 2.14 alike): an idle side stream answers True."""
    x, side = torch.ones(4, device="cuda"), torch.cuda.Stream()
    compiled = torch.compile(_doubled_and_queried)
    for _ in range(2):
        y, idle = compiled(x, side)
        torch.cuda.synchronize()
        assert idle is True
        assert y.cpu().tolist() == [2.0] * 4


# --- compile_fx_inner called by code itself on a graph with stream nodes ----------------------

def _make_fx_graph_with_a_side_stream(x, joined: bool):
    """A `make_fx` graph as PyTorch's stream tests build one: the side stream's matmul marked with
    its index among the objects `get_external_object_by_index` answers, the waits as
    `torch.ops.streams` ops."""
    import torch._dynamo.variables.streams  # noqa: F401 (defines the ops' namespace)
    import torch.fx.traceback as fx_traceback
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(x):
        torch.ops.streams.wait_stream(1, 0)
        with fx_traceback.annotate({"stream": 1}):
            y = x @ x
        if joined:
            torch.ops.streams.wait_stream(0, 1)
        return (y + 1,)

    with fx_traceback.preserve_node_meta():
        return make_fx(fn)(x)


def test_compile_fx_inner_on_a_graph_with_stream_nodes(cuda_kind):
    """On the emulated device inductor's code for it named streams no cpu graph defines ("NameError:
    name 'default_stream' is not defined") until 2026-12-08."""
    from torch._dynamo.graph_bytecode_inputs import store_user_object_weakrefs
    from torch._inductor.compile_fx import compile_fx_inner

    current, side = torch.cuda.current_stream(), torch.cuda.Stream()
    store_user_object_weakrefs(current, side)  # held here: the table keeps weak references
    x = torch.ones(4, 4, device="cuda")
    compiled = compile_fx_inner(_make_fx_graph_with_a_side_stream(x, joined=True), [x])
    for _ in range(2):
        out = compiled([x])
        torch.cuda.synchronize()
        assert out[0].cpu().tolist() == [[5.0] * 4] * 4


def test_compile_fx_inner_reports_a_race_between_the_graphs_streams(cuda_device):
    from torch._dynamo.graph_bytecode_inputs import store_user_object_weakrefs
    from torch._inductor.compile_fx import compile_fx_inner

    current, side = torch.cuda.current_stream(), torch.cuda.Stream()
    store_user_object_weakrefs(current, side)
    x = torch.ones(4, 4, device="cuda")
    with pytest.raises(RaceError, match="streams touching the same memory"):
        compile_fx_inner(_make_fx_graph_with_a_side_stream(x, joined=False), [x])([x])
    torch.cuda.synchronize()


def test_a_graph_reading_a_stream_as_a_value_is_refused_where_it_would_run_as_pieces(cuda_device):
    """The pieces pass tensors between them, not the objects dynamo hands the graph: a node of
    a marked graph that reads one as a value is refused by name when the tracking would run the
    graph as pieces (untracked, the graph runs as one op)."""
    from torch._dynamo.graph_bytecode_inputs import get_external_object_by_index

    from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice
    from harness.emulation.compiled_stream_pieces import StreamPieces, plan_of

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    side = graph.call_function(get_external_object_by_index, (1,))
    doubled = graph.call_function(torch.mul, (x, 2))
    doubled.meta["custom"] = {"stream": 1}
    handed = graph.call_function(getattr, (side, "stream_id"))
    handed.meta["custom"] = {"stream": 1}
    graph.output((doubled, handed))
    plan = plan_of(torch.fx.GraphModule(torch.nn.Module(), graph))
    with pytest.raises(UnsupportedOnEmulatedDevice, match="node getattr_1? of a compiled graph "
                                                          "reads a stream or event"):
        StreamPieces(plan)(torch.ones(2, device="cuda"))


def _record_query_and_return(x, side):
    side.wait_stream(_current())
    with torch.cuda.stream(side):
        y = x * 2
        done = side.record_event()
    return y, done, done.query()


def test_an_event_the_graph_queries_still_orders_its_waiter(cuda_device):
    """`done.query()` is answered while dynamo traces; on torch 2.11 the query node read the
    `record_event()` call's result, which kept that call in the graph, run only while
    AOTAutograd traced: the returned event was not recorded at run time (until 2026-12-08)."""
    x, side, reader = torch.ones(4, device="cuda"), torch.cuda.Stream(), torch.cuda.Stream()
    compiled = torch.compile(_record_query_and_return)
    for _ in range(2):
        y, done, _ = compiled(x, side)
        with torch.cuda.stream(reader):
            reader.wait_event(done)
            z = y + 1
        torch.cuda.synchronize()
        assert z.cpu().tolist() == [3.0] * 4
    y, done, _ = compiled(x, side)
    with pytest.raises(RaceError, match="streams touching the same memory"):
        with torch.cuda.stream(reader):
            y + 1  # the planted bug: no wait on `done`
    torch.cuda.synchronize()
