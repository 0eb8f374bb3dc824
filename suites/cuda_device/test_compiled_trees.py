"""Inductor's cudagraph trees on the emulated CUDA device (harness/emulation/compiled_trees.py):
which compiled graphs are replayed through CUDA graphs, trees' generations (outputs of a warm-up
or a recording overwritten by the next one raise trees' error). Torch's own trees driven directly
are test_pool_checkpoints.py's. The `cuda_kind` rows run natively on a GPU to show CUDA's answer."""

from __future__ import annotations

import contextlib
import inspect

import pytest
import torch
# bound when the module is imported, before any emulation is entered, as a runtime's backend
# module binds it (vLLM's older compiler interface)
from torch._inductor.compile_fx import compile_fx_inner as compile_fx_inner_bound_at_import

from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice

OVERWRITTEN = "overwritten by a subsequent run"
# torch defines the call that makes a storage raise on access with CUDA: a CPU wheel lacks it.
needs_access_errors = pytest.mark.skipif(
    not hasattr(torch._C, "_set_storage_data_ptr_access_error_msg"),
    reason="this torch (a CPU wheel) cannot make a storage raise on access "
           "(torch._C._set_storage_data_ptr_access_error_msg)")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _cubed(x):
    return x * x * x


def _refused_in_the_sanitizer(cuda_kind):
    """The graph sanitizer refuses inductor's CUDA graphs by name (sanitizer.py)."""
    if cuda_kind != "sanitizer":
        return contextlib.nullcontext()
    # dynamo's cudagraphs backend meets it while compiling: BackendCompilerFailed carries it
    return pytest.raises((UnsupportedOnEmulatedDevice, torch._dynamo.exc.BackendCompilerFailed),
                         match="cudagraph trees")


def test_inductors_cudagraphs_config_replays_a_plain_compile(cuda_kind):
    """`torch._inductor.config.triton.cudagraphs = True` makes inductor wrap every graph it
    compiles in cudagraph trees, whose replays hand back the same output tensor each time; until
    2026-12-06 the emulated device read only the compile's own mode and ran it without graphs
    (a new tensor per call)."""
    compiled = torch.compile(_cubed)
    x = torch.rand(4, device="cuda")
    with _refused_in_the_sanitizer(cuda_kind), \
            torch._inductor.config.patch({"triton.cudagraphs": True}):
        compiled(x), compiled(x)  # warm-up, recording
        first, second = compiled(x), compiled(x)  # replays
        assert first is second
        torch.testing.assert_close(second, _cubed(x))


@needs_access_errors
def test_an_output_of_the_warm_up_is_overwritten_by_the_next_generation(cuda_kind):
    compiled = torch.compile(_cubed, mode="reduce-overhead")
    x = torch.rand(4, device="cuda")
    with _refused_in_the_sanitizer(cuda_kind):
        warm = compiled(x)
        kept = warm.clone()  # the remedy trees name: a copy outside the compiled code
        recorded = compiled(x)
        with pytest.raises(RuntimeError, match=OVERWRITTEN) as error:
            warm + 1
        assert "x * x * x" in str(error.value)  # the line that made the output
        torch.testing.assert_close(kept, _cubed(x))
        torch.testing.assert_close(recorded, _cubed(x))


@needs_access_errors
def test_an_output_of_the_recording_is_overwritten_by_the_first_replay(cuda_kind):
    compiled = torch.compile(_cubed, mode="reduce-overhead")
    x = torch.rand(4, device="cuda")
    with _refused_in_the_sanitizer(cuda_kind):
        compiled(x)
        recorded = compiled(x)
        replayed = compiled(x)
        with pytest.raises(RuntimeError, match=OVERWRITTEN):
            recorded.sum()
        torch.testing.assert_close(replayed, _cubed(x))
        again = compiled(x * 2)  # a replay: its outputs are the graph's, rewritten, not refused
        assert again is replayed
        torch.testing.assert_close(again, _cubed(x * 2))


def test_outputs_of_one_call_across_a_graph_break_stay_readable(cuda_kind):
    """Graphs run in one call of the compiled function are one generation: the first graph's
    output feeds the second."""
    def broken(x):
        y = x * 2
        torch._dynamo.graph_break()
        return y, y + 1

    compiled = torch.compile(broken, mode="reduce-overhead")
    with _refused_in_the_sanitizer(cuda_kind):
        for step in range(4):
            x = torch.full((4,), float(step), device="cuda")
            y, z = compiled(x)
            assert y.tolist() == [2.0 * step] * 4 and z.tolist() == [2.0 * step + 1] * 4


def test_dynamos_cudagraphs_backend_replays_through_the_devices_graphs(cuda_kind):
    """backend="cudagraphs" is cudagraph trees over AOTAutograd's graphs: its replays hand back
    the same output tensor each time. The emulated device ran it without graphs until 2026-12-06
    (the backend, compiling for the cpu, skipped them)."""
    compiled = torch.compile(_cubed, backend="cudagraphs")
    x = torch.rand(4, device="cuda")
    with _refused_in_the_sanitizer(cuda_kind):
        compiled(x), compiled(x)  # warm-up, recording
        first, second = compiled(x), compiled(x * 2)
        assert first is second
        torch.testing.assert_close(second, _cubed(x * 2))


@pytest.mark.parametrize("partition", [False, True], ids=["skipped", "partitioned"])
def test_a_graph_of_symbolic_shapes_runs_without_cuda_graphs_when_asked(cuda_kind, partition):
    """Under `triton.cudagraph_skip_dynamic_graphs` inductor runs a graph with symbolic shapes
    without CUDA graphs: without graph partition it logs and counts the skip ("graph with symbolic
    shapes inputs"); with it (the default) it leaves the nodes using a symbol out of its graph
    partitions, here all of them, and counts none. The emulated device recorded and replayed the
    graph (until 2026-12-07; PyTorch's test_skip_symbolic, written before graph partition)."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's cudagraph trees by name")
    from torch._dynamo.utils import counters

    compiled = torch.compile(lambda x, y: x + y, dynamic=True, mode="reduce-overhead")
    counters.clear()
    with torch._inductor.config.patch({"triton.cudagraph_skip_dynamic_graphs": True,
                                       "graph_partition": partition}):
        x, y = torch.rand(10, device="cuda"), torch.rand(10, device="cuda")
        outs = [compiled(x, y) for _ in range(4)]  # a warm-up, a recording and replays if graphed
    assert outs[2] is not outs[3]  # replays would hand back one tensor
    torch.testing.assert_close(outs[3], x + y)
    assert counters["inductor"]["cudagraph_skips"] == (0 if partition else 1)


def _graph_pool_blocks() -> int:
    """Blocks in use in graph pools (PyTorch's tree tests count these at their tearDown)."""
    return sum(1 for segment in torch.cuda.memory_snapshot() if segment["segment_pool_id"] != (0, 0)
               for block in segment["blocks"] if block["state"] == "active_allocated")


def test_dynamo_reset_drops_the_recordings_while_the_compiled_code_lives(cuda_kind):
    """`torch._dynamo.reset()` shuts cudagraph trees down even though the compiled function is
    still referenced; the next call warms up again, and the pool holds no block once the cache is
    emptied. (Natively the pool showed no active block before the reset either, once the output
    was dropped; the emulated device's snapshot still shows the recording's outputs then: H100,
    torch 2.11, 2026-12-06.)"""
    compiled = torch.compile(_cubed, mode="reduce-overhead")
    x = torch.rand(4, device="cuda")
    with _refused_in_the_sanitizer(cuda_kind):
        for _ in range(3):
            out = compiled(x)
        del out
        torch._dynamo.reset()
        torch.cuda.empty_cache()
        assert _graph_pool_blocks() == 0
        torch.testing.assert_close(compiled(x), _cubed(x))  # still runs: a new warm-up


def test_an_output_held_across_dynamo_reset_stays_readable(cuda_kind):
    """torch's shutdown of the trees sets no access error on the outputs the program holds (none
    raised natively, H100, torch 2.11, 2026-12-06; torch 2.14's `shutdown` sets none either). The
    emulated device made them raise "overwritten by a subsequent run" until later that day."""
    compiled = torch.compile(_cubed, mode="reduce-overhead")
    x = torch.rand(4, device="cuda")
    with _refused_in_the_sanitizer(cuda_kind):
        held = [compiled(x) for _ in range(4)][-1]  # a replay's output
        torch._dynamo.reset()
        held.sum()


def test_reduce_overhead_runs_a_graph_with_data_dependent_ops(cuda_kind):
    """`.item()` and `nonzero()` inside the graph (dynamo's capture_scalar_outputs and
    capture_dynamic_output_shape_ops): inductor runs them without a CUDA graph (or replays the
    partitions around them). The emulated device's fake-tensor analysis of the graph raised
    DataDependentOutputException / DynamicOutputShapeException at the second call (until
    2026-12-06)."""
    if cuda_kind == "native":
        pytest.skip("natively (H100, torch 2.11, 2026-12-06) this graph raised CUDA's illegal "
                    "memory access, which leaves the process's CUDA context unusable")
    item = torch.compile(lambda x: x.item() + 1, mode="reduce-overhead")
    nonzero = torch.compile(lambda x: (x * 2).nonzero(), mode="reduce-overhead")
    with _refused_in_the_sanitizer(cuda_kind), torch._dynamo.config.patch(
            capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True):
        assert [item(torch.tensor(v, device="cuda")) for v in (3, 6, 7)] == [4, 7, 8]
        for values, expected in (([1, 0, 2], [[0], [2]]), ([0, 0, 5], [[2]]), ([1, 1, 0], [[0], [1]])):
            out = nonzero(torch.tensor(values, device="cuda"))
            assert out.is_cuda and out.tolist() == expected


def test_a_graph_run_twice_in_one_step_keeps_both_outputs(cuda_kind):
    """Between two `cudagraph_mark_step_begin()` calls the trees make a second run of the same
    graph another node of the tree, recorded with memory of its own (a draft model run k times per
    step). The emulated device replayed the first run's recording again, so the second run wrote
    over the first one's outputs (until 2026-12-06)."""
    compiled = torch.compile(lambda x: x * 2 + 1, mode="reduce-overhead")
    seen = []
    with _refused_in_the_sanitizer(cuda_kind):
        for step in range(4):  # warm-up, recording, then replays of both nodes
            torch.compiler.cudagraph_mark_step_begin()
            first = compiled(torch.full((4,), float(step), device="cuda"))
            second = compiled(torch.full((4,), float(step + 10), device="cuda"))
            seen.append((first[0].item(), second[0].item()))
        assert seen == [(2 * s + 1, 2 * s + 21) for s in range(4)]


@pytest.mark.parametrize("cudagraphs", [False, True])
def test_compile_fx_inner_called_directly_on_a_make_fx_graph(cuda_kind, cudagraphs):
    """PyTorch's tests call inductor's `compile_fx_inner` themselves, on a `make_fx` graph with
    fake cuda inputs, and call the result with one list of inputs. On the emulated device it
    compiled with the device's modes on the stack and failed in inductor's fake-tensor
    propagation (until 2026-12-06)."""
    if cudagraphs and cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's cudagraph trees by name")
    from torch._inductor.compile_fx import compile_fx_inner
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(x, y):
        return (x + y,)

    graph = make_fx(fn)(*[torch.rand(5, 5, device="cuda") for _ in range(2)])
    with torch._subclasses.FakeTensorMode():
        fakes = [torch.rand(6, 5, device="cuda")[1:] for _ in range(2)]
    compiled = compile_fx_inner(graph, fakes, static_input_idxs=[0], cudagraphs=cudagraphs)
    for _ in range(3):
        x, y = [torch.rand(6, 5, device="cuda")[1:] for _ in range(2)]
        inputs = [x, y]
        out = compiled(inputs)
        assert inputs == []  # the boxed convention: the callee takes the inputs
        assert out[0].is_cuda
        torch.testing.assert_close(out[0], x + y)


@pytest.mark.parametrize("cudagraphs", [False, True])
def test_compile_fx_inner_bound_before_the_emulation(cuda_kind, cudagraphs):
    """A runtime's backend that imported `compile_fx_inner` before the emulation was entered
    calls inductor's own function, which the device's replacement of the module's name does not
    reach: on the emulated device inductor wrote CUDA code for the device's cpu tensors ("Cannot
    find a working triton installation"; for a matmul "name '_get_device_properties' is not
    defined") until 2026-12-08."""
    if cudagraphs and cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's cudagraph trees by name")
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(x, w):
        return ((x @ w).relu() + 1,)

    x, w = torch.randn(8, 8, device="cuda"), torch.randn(8, 8, device="cuda")
    compiled = compile_fx_inner_bound_at_import(make_fx(fn)(x, w), [x, w],
                                                static_input_idxs=[1], cudagraphs=cudagraphs)
    for _ in range(3):
        x = torch.randn(8, 8, device="cuda")
        inputs = [x, w]
        out = compiled(inputs)
        assert inputs == []
        assert out[0].is_cuda
        torch.testing.assert_close(out[0], fn(x, w)[0])


def _add_one_in_place(x):
    x.add_(1)
    return x


def test_cudagraph_or_error_raises_where_a_graph_is_skipped(cuda_kind):
    """`triton.cudagraph_or_error`: a graph that cannot run as a CUDA graph (it writes its
    input) raises at its first call instead of running without one. The emulated device counted
    its skip without raising, and only at the layout's second call (until 2026-12-06)."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's cudagraph trees by name")
    compiled = torch.compile(_add_one_in_place, mode="reduce-overhead")
    with torch._inductor.config.patch({"triton.cudagraph_or_error": True}), \
            pytest.raises(RuntimeError, match="skipping cudagraphs due to mutated inputs"):
        compiled(torch.tensor(1, device="cuda"))


def test_a_skip_is_counted_at_the_first_call(cuda_kind):
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's cudagraph trees by name")
    from torch._dynamo.utils import counters

    counters.clear()
    compiled = torch.compile(_add_one_in_place, mode="reduce-overhead")
    x = torch.tensor(1, device="cuda")
    compiled(x)
    assert counters["inductor"]["cudagraph_skips"] == 1
    compiled(x), compiled(x)
    assert x.item() == 4 and counters["inductor"]["cudagraph_skips"] == 1


@needs_access_errors
@pytest.mark.parametrize("keep", ["detach", "view"])
def test_a_detached_copy_of_a_warm_up_output_is_overwritten_too(cuda_kind, keep):
    """The trees free the previous generation's memory, not tensor objects: a `.detach()` or a
    view the program made of an output raises as the output does. The emulated device made only
    the returned tensor raise (until 2026-12-06), so a detached copy read what the next run
    wrote."""
    compiled = torch.compile(_cubed, mode="reduce-overhead")
    x = torch.rand(4, device="cuda")
    with _refused_in_the_sanitizer(cuda_kind):
        kept = compiled(x).detach() if keep == "detach" else compiled(x)[1:]
        compiled(x)  # the next generation: a recording into the same pool
        with pytest.raises(RuntimeError, match=OVERWRITTEN):
            kept + kept


@pytest.mark.parametrize("limit", [0, 8])
def test_a_cudagraph_managed_input_that_moves_re_records_up_to_the_limit(cuda_kind, limit):
    """A graph recorded reading another graph's output (a "cudagraph managed" tensor, which the
    trees bake in by address) and later given another tensor there: the trees record it again
    under that node, and past `cudagraph_unexpected_rerecord_limit` run it without a graph there,
    logging and counting one skip. The emulated device copied such an input like any other and
    replayed (until 2026-12-06)."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's cudagraph trees by name")
    from torch._dynamo.utils import counters

    counters.clear()
    foo = torch.compile(lambda x: x + 1, mode="reduce-overhead")
    goo = torch.compile(lambda x: x * 2, mode="reduce-overhead")
    with torch._inductor.config.patch({"triton.cudagraph_unexpected_rerecord_limit": limit,
                                       "triton.cudagraph_support_input_mutation": True}):
        for _ in range(3):  # warm-up, recording (goo's under foo's node), replay
            torch.compiler.cudagraph_mark_step_begin()
            goo(foo(torch.rand(2, 3, device="cuda")))
        for _ in range(4):
            torch.compiler.cudagraph_mark_step_begin()
            x = torch.rand(2, 3, device="cuda")
            z = goo(foo(x).clone())
            torch.testing.assert_close(z, (x + 1) * 2)
        # torch 2.11's trees ignore the limit while dynamo inlines nn modules (its default: no
        # skip natively on an H100, 2026-12-06), later ones enforce it: the build's own answer
        enforced = _trees_enforce_the_limit_at(1)
    assert counters["inductor"]["cudagraph_skips"] == (1 if limit == 0 and enforced else 0)


def _trees_enforce_the_limit_at(count: int) -> bool:
    import types

    manager = torch._inductor.cudagraph_trees.CUDAGraphTreeManager
    return bool(manager.exceed_rerecord_limit(
        types.SimpleNamespace(num_rerecord={None: {0: count}}), None, 0))


def _with_its_first_row(x):
    y = x * 20
    return y, y[0], y[1:]


def test_outputs_that_alias_each_other_still_do_after_a_recording(cuda_kind):
    """A graph returning `y` and views of it: CUDA hands back one memory, which the trees'
    replays keep. The emulated device's capture ran the graph as one op, whose outputs were
    separate memory each (until 2026-12-06)."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's cudagraph trees by name")
    compiled = torch.compile(_with_its_first_row, mode="reduce-overhead")
    for _ in range(4):  # warm-up, recording, replays
        x = torch.rand(3, 4, device="cuda")
        y, first, rest = compiled(x)
        assert first.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
        assert rest.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
        torch.testing.assert_close(first, x[0] * 20)
        y.fill_(7)
        assert first.eq(7).all() and rest.eq(7).all()


def _add_two_in_place(x):
    x.add_(2)
    return x


def test_a_graph_may_write_another_recordings_output_but_not_an_eager_tensor(cuda_kind):
    """With `triton.cudagraph_support_input_mutation` (the default) the trees let a graph write
    an input that is another graph's output (cudagraph managed memory), and decide at each call:
    given an eager tensor to write, the graph runs without a CUDA graph, its skip logged once.
    The emulated device skipped such a graph for good at its first write of any input, and
    counted it without the log's "Found from" line (until 2026-12-06)."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's cudagraph trees by name")
    import logging

    from torch._dynamo.utils import counters

    counters.clear()
    foo = torch.compile(lambda x: x + 1, mode="reduce-overhead")
    mut = torch.compile(_add_two_in_place, mode="reduce-overhead")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    log = logging.getLogger("torch._inductor.cudagraph_utils.__cudagraphs")
    log.addHandler(handler)
    try:
        with torch._inductor.config.patch({"triton.cudagraph_support_input_mutation": True}):
            for _ in range(3):
                torch.compiler.cudagraph_mark_step_begin()
                x = torch.rand(4, device="cuda")
                torch.testing.assert_close(mut(foo(x)), x + 3)
            assert "cudagraph_skips" not in counters["inductor"]
            for _ in range(2):
                torch.compiler.cudagraph_mark_step_begin()
                x = torch.rand(4, device="cuda")
                eager = foo(x).clone()
                mut(eager)
                torch.testing.assert_close(eager, x + 3)
    finally:
        log.removeHandler(handler)
    skips = [r.getMessage() for r in records if "mutated inputs" in r.getMessage()]
    assert len(skips) == 1 and "Found from" in skips[0] and "x.add_(2)" in skips[0]
    assert counters["inductor"]["cudagraph_skips"] == 1


def _draw_five(probs):
    return torch.multinomial(probs, 5, replacement=True)


def test_a_compiled_graph_draws_from_the_devices_generator(cuda_kind):
    """Inductor falls back to aten's kernel for `torch.multinomial`, which on CUDA draws from the
    device's generator, as the eager call does: with the state set back, the same samples. On
    the emulated device the compiled graph's random ops drew from the cpu's generator (until
    2026-12-06)."""
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4], device="cuda")
    compiled = torch.compile(_draw_five)
    state = torch.cuda.get_rng_state()
    eager = [_draw_five(probs) for _ in range(2)]
    torch.cuda.set_rng_state(state)
    cpu_state = torch.get_rng_state()
    drawn = [compiled(probs) for _ in range(2)]
    assert [d.tolist() for d in drawn] == [e.tolist() for e in eager]
    assert torch.equal(torch.get_rng_state(), cpu_state)  # the host's generator is not drawn from


class _ReturnsItsParameter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.param = torch.nn.Parameter(torch.tensor([float(i) for i in range(10)], device="cuda"))

    def forward(self, inp):
        return self.param, self.param[0:2], inp + 2


def test_an_output_of_a_parameter_is_not_the_pools(cuda_kind):
    """A graph returning a view of a parameter it reads as an attribute (inductor's freezing):
    that memory is the module's, not the trees' pool, and the next generation leaves it alone."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's cudagraph trees by name")
    module = _ReturnsItsParameter()
    inp = torch.tensor([2.0], device="cuda")
    with torch.no_grad(), torch._inductor.config.patch({"freezing": True,
                                                        "triton.cudagraphs": True}):
        compiled = torch.compile(module)
        sums = [[o.sum().item() for o in compiled(inp)] for _ in range(3)]
    assert sums == [[45.0, 1.0, 4.0]] * 3
    assert module.param.sum().item() == 45.0


def test_a_fake_tensor_mode_under_stream_tracking(cuda_device):
    """PyTorch's tests make fake cuda inputs (for compile_fx_inner) once a side stream has
    switched stream tracking on: the tracking met the fake mode's `prim::device`, an op the
    dispatcher does not hold, and failed ("operator prim::device does not exist") until
    2026-12-06."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.ones(2, device="cuda").add_(1)
    torch.cuda.synchronize()
    with torch._subclasses.FakeTensorMode():
        fakes = [torch.rand(6, 5, device="cuda")[1:] for _ in range(2)]
    assert [tuple(f.shape) for f in fakes] == [(5, 5), (5, 5)]


def test_a_recording_counts_the_inputs_it_copies(cuda_kind):
    """The trees count, at each recording, the inputs a replay copies in (neither static, as a
    parameter is, nor another recording's output) in inductor's
    `cudagraph_recorded_non_static_inputs` (PyTorch's test_compiled_autograd_static_input_params
    reads it). The emulated device counted none (until 2026-12-06)."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's cudagraph trees by name")
    from torch._dynamo.utils import counters

    linear = torch.nn.Linear(4, 4, device="cuda")
    compiled = torch.compile(lambda x: linear(x), mode="reduce-overhead")
    x = torch.rand(2, 4, device="cuda")
    counters.clear()
    with torch.no_grad():
        for _ in range(4):  # warm-up, recording, replays
            out = compiled(x)
        torch.testing.assert_close(out, linear(x))
    assert counters["inductor"]["cudagraph_recorded_non_static_inputs"] == 1


def test_a_training_step_replays_the_forward_and_backward_it_recorded(cuda_kind):
    """A training loop records its forward and its backward once and replays them at each later
    step (one recording per version of the parameters). The backward saves the forward's input
    `x`, which the trees give it at the address of the forward recording's copy of `x`, the same
    at each replay; the emulated device rebuilt that saved `x` from the caller's tensor, new at
    each step, so the backward was recorded again at every step (until 2026-12-07: PyTorch's
    test_multi_dispatch_* cases counted 15 to 18 graphs for 4 to 6)."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's cudagraph trees by name")
    from torch._dynamo.utils import counters

    weight = torch.nn.Parameter(torch.rand(2, 2, device="cuda"))
    compiled = torch.compile(lambda x, w: x * w, mode="reduce-overhead")
    counters.clear()
    for step in range(5):  # warm-up, recording, replays
        x = torch.full((2, 2), float(step + 1), device="cuda")
        compiled(x, weight).sum().backward()
        torch.testing.assert_close(weight.grad, x)
        weight.grad = None
    # one recording of the forward and one of the backward, each copying one input in at a
    # replay (`x`; the backward's gradient of the output)
    assert counters["inductor"]["cudagraph_recorded_non_static_inputs"] == 2


def test_a_training_loop_that_keeps_its_last_loss_records_once_its_backward_ran(cuda_kind):
    """The trees wait for a training forward's backward before starting a new generation, and
    only for that: a loop whose loss variable still holds the last step's loss (it is replaced
    after the next forward) records at its second step as any other. The emulated device's
    stand-in for the trees (a CPU wheel, torch 2.11) waited while any output still required grad,
    so such a loop warmed up at every step and never recorded (until 2026-12-07)."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's cudagraph trees by name")
    from torch._dynamo.utils import counters

    weight = torch.nn.Parameter(torch.rand(2, 2, device="cuda"))
    compiled = torch.compile(lambda x, w: (x * w).sum(), mode="reduce-overhead")
    counters.clear()
    for step in range(4):  # warm-up, recording, replays
        x = torch.full((2, 2), float(step + 1), device="cuda")
        loss = compiled(x, weight)
        loss.backward()
        torch.testing.assert_close(weight.grad, x)
        weight.grad = None
    assert counters["inductor"]["cudagraph_recorded_non_static_inputs"] == 2  # `x`; the gradient


@needs_access_errors
def test_a_recorded_backward_frees_the_activations_it_saved(cuda_kind):
    """AOTAutograd hands the backward its saved activations in a list the callee empties, so
    they die while the backward runs; the trees note at its recording which outputs of the
    forward's recording died (and expect them to die at each replay). The emulated device held
    them until the call returned, so its recordings noted none (until 2026-12-07; PyTorch's
    test_forward_backward)."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's cudagraph trees by name")
    if cuda_kind == "emulated" and not hasattr(torch.UntypedStorage, "_swap_data_ptr_"):
        pytest.skip("this torch (2.11) lacks UntypedStorage._swap_data_ptr_: the emulated device "
                    "keeps its stand-in for the trees")
    from torch._inductor.cudagraph_trees import get_container

    compiled = torch.compile(lambda x: torch.sin(x * 2) * x.cos(), mode="reduce-overhead")
    x = torch.rand(4, 4, device="cuda", requires_grad=True)
    for _ in range(2):  # warm-up, recording
        x.grad = None  # a gradient the trees' pool holds is overwritten by the next step
        out = compiled(x)
        out.sum().backward()
    torch.testing.assert_close(x.grad, _sin_cos_grad(x.detach()))
    node = get_container(torch.cuda.current_device()).tree_manager.current_node
    assert node.expected_dead_indices_before_graph == []
    # the forward's outputs: `out` (kept), then the activations the backward saved (all died)
    saved = len(node.parent.outputs_weakrefs) - 1
    assert saved > 0
    assert node.expected_dead_indices_after_graph == [(0, i) for i in range(1, saved + 1)]


def _sin_cos_grad(x):
    return 2 * torch.cos(x * 2) * x.cos() - torch.sin(x * 2) * x.sin()


def _cubes_across_a_graph_break(x, y):
    x_out = x * x * x
    torch._dynamo.graph_break()
    return x_out, y * y * y


def test_a_recording_replays_while_a_previous_steps_outputs_refuse_access(cuda_kind):
    """Each step runs the backward of one of two outputs: the other's saved activations, outputs
    of a recording the previous step made, stay alive and are freed to the trees' pool at the next
    step, which makes them raise on access; the recording then replays. The emulated device's
    replay read those storages' addresses for its own checks and raised the trees' "overwritten"
    error at the replay (until 2026-12-07; PyTorch's
    test_forward_backward_not_called_backend_inductor)."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's cudagraph trees by name")
    compiled = torch.compile(_cubes_across_a_graph_break, mode="reduce-overhead")
    for _ in range(3):  # warm-up, recordings, replays
        x, y = (torch.rand(20, 20, device="cuda", requires_grad=True) for _ in range(2))
        x_out, y_out = compiled(x, y)
        x_out.sum().backward()
        torch.testing.assert_close(x.grad, 3 * x.detach() ** 2)
        torch.testing.assert_close(y_out, y.detach() ** 3)


def test_a_parameter_that_moves_is_recorded_again_past_the_limit(cuda_kind):
    """A static input at a new address (a parameter whose `.data` is replaced) is recorded again
    each time; from torch 2.13 the trees do not count such moves against
    `cudagraph_unexpected_rerecord_limit` (nor does 2.11, which ignores the limit while dynamo
    inlines nn modules), so the graph never falls back to running without one. The emulated
    device counted them and, past the limit, ran the graph without a CUDA graph from then on
    (until 2026-12-06)."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's cudagraph trees by name")
    source = inspect.getsource(torch._inductor.cudagraph_trees.CUDAGraphTreeManager._run)
    if "!= CheckInvariantStatus.StaticInputIdxMismatch" not in source \
            and _trees_enforce_the_limit_at(1):
        pytest.skip("this torch's trees count a static input's move against the limit")
    from torch._dynamo.utils import counters

    linear = torch.nn.Linear(4, 4, device="cuda")
    compiled = torch.compile(linear, mode="reduce-overhead")
    x = torch.rand(2, 4, device="cuda")
    counters.clear()
    with torch.no_grad(), torch._inductor.config.patch(
            {"triton.cudagraph_unexpected_rerecord_limit": 0}):
        for _ in range(5):
            linear.weight.data = torch.rand(4, 4, device="cuda")
            out = compiled(x)
            torch.testing.assert_close(out, x @ linear.weight.T + linear.bias)
    assert counters["inductor"]["cudagraph_skips"] == 0


REALLOCATIONS = 48


def test_a_parameter_reallocated_at_its_captured_address_is_read_there(cuda_kind):
    """The trees replay a recording when its static inputs are at the captured addresses: they
    compare data pointers, not buffers. A parameter reassigned with `.data = ...` whose new memory
    landed where the captured one was freed is read there, on CUDA as on the emulated device,
    which until 2026-12-06 refused the replay (`FreedMemoryError`, the captured buffer freed)
    whenever the host allocator handed the address back (at random there: host memory)."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's cudagraph trees by name")
    linear = torch.nn.Linear(4, 4, device="cuda")
    compiled = torch.compile(linear, mode="reduce-overhead")
    x = torch.rand(2, 4, device="cuda")
    addresses = set()
    with torch.no_grad():
        for _ in range(3):  # warm-up, recording, replay
            compiled(x)
        for _ in range(REALLOCATIONS):
            # the new buffer is made while the old one lives, which is freed next: CUDA's
            # caching allocator alternates two blocks, the emulated device's host memory often
            addresses.add(linear.weight.data_ptr())
            linear.weight.data = torch.rand(4, 4, device="cuda")
            out = compiled(x)
            torch.testing.assert_close(out, x @ linear.weight.T + linear.bias)
    if len(addresses) == REALLOCATIONS:
        pytest.skip(f"no address came back in {REALLOCATIONS} reallocations: nothing was checked")


def test_too_many_recorded_sizes_warn_once(cuda_kind):
    """The trees record one function per set of a graph's dynamic sizes, and past
    `triton.cudagraph_dynamic_shape_warn_limit` sizes log their warning, once per graph. The
    emulated device recorded each size without it (until 2026-12-06)."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's cudagraph trees by name")
    from unittest import mock

    from torch._inductor import cudagraph_utils

    compiled = torch.compile(lambda x: x * 2 + 1, mode="reduce-overhead")
    with torch._inductor.config.patch({"triton.cudagraph_dynamic_shape_warn_limit": 1}), \
            mock.patch.object(cudagraph_utils.cudagraphs_log, "warning") as warning:
        for size in (2, 3, 4, 5):  # 2 compiles static; 3 on, one dynamic graph
            x = torch.rand(size, device="cuda")
            for _ in range(3):
                torch.testing.assert_close(compiled(x), x * 2 + 1)
    messages = [call.args[0] for call in warning.call_args_list]
    assert len(messages) == 1 and "We have observed 2 distinct sizes" in messages[0]


def test_every_recording_is_captured_on_one_stream(cuda_kind):
    """The trees' manager records every graph of a device on one side stream of its own, so its
    graph-pool segments all belong to that stream (PyTorch's test_single_stream_use). The
    emulated device captured each recording on a new stream (until 2026-12-06)."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's cudagraph trees by name")

    def pool_streams():
        return {seg["stream"] for seg in torch.cuda.memory_snapshot()
                if seg["segment_pool_id"] != (0, 0)}

    before = pool_streams()
    first = torch.compile(_cubed, mode="reduce-overhead")
    second = torch.compile(lambda x: (x + 1).relu(), mode="reduce-overhead")
    x = torch.rand(4, device="cuda")
    outs = []
    for _ in range(3):
        torch.compiler.cudagraph_mark_step_begin()
        outs = [first(x), second(x)]
    torch.testing.assert_close(outs[0], _cubed(x))
    assert len(pool_streams() - before) == 1


def _pool_segment_streams() -> set:
    return {segment["stream"] for segment in torch.cuda.memory_snapshot()
            if segment["segment_pool_id"] != (0, 0)
            and any(block["state"] == "active_allocated" for block in segment["blocks"])}


def test_a_warm_ups_output_is_a_block_of_a_graph_pool_on_the_trees_stream(cuda_kind):
    """The trees run a warm-up on their side stream with the thread's allocations routed to their
    graph pool (`_use_cuda_memory_pool_manager`), so its output is a graph-pool block until the
    program drops it (PyTorch's test_execution_into_recording counts it). The emulated device
    warmed up on the current stream, in the regular pool, until 2026-12-07."""
    compiled = torch.compile(_cubed, mode="reduce-overhead")
    x = torch.rand(4, device="cuda")
    before = _graph_pool_blocks()
    with _refused_in_the_sanitizer(cuda_kind):
        out = compiled(x)  # the warm-up
        assert _graph_pool_blocks() == before + 1
        assert torch.cuda.current_stream().cuda_stream not in _pool_segment_streams()
        torch.testing.assert_close(out, _cubed(x))
        del out
        assert _graph_pool_blocks() == before


def test_a_recordings_output_block_goes_back_when_the_program_drops_it(cuda_kind):
    """A recording's outputs hold their graph-pool blocks while the program holds them, not for
    as long as the recording lives: dropped, the blocks are free (PyTorch's
    test_accumulate_multiple_recordings; natively the pool showed no active block once the output
    was dropped, H100, torch 2.11, 2026-12-06). A replay's outputs hold none: the trees build them
    over the pool from its pointers (test_execution_into_recording: 0 "in execution mode"). The
    emulated device kept every recording's outputs allocated until `torch._dynamo.reset()` until
    2026-12-06."""
    compiled = torch.compile(_cubed, mode="reduce-overhead")
    x = torch.rand(4, device="cuda")
    before = _graph_pool_blocks()
    with _refused_in_the_sanitizer(cuda_kind):
        held_blocks = []
        for step in range(4):  # warm-up, recording, two replays
            torch.compiler.cudagraph_mark_step_begin()
            out = compiled(x * (step + 1))
            held_blocks.append(_graph_pool_blocks() - before)
            torch.testing.assert_close(out, _cubed(x * (step + 1)))
            del out
            assert _graph_pool_blocks() == before
        assert held_blocks == [1, 1, 0, 0]


def test_the_next_generation_frees_a_held_warm_up_outputs_block(cuda_kind):
    """A new generation frees the blocks of the last one's warm-up outputs, held or not (the
    trees' `dealloc_current_path_weakrefs`): with the warm-up's output kept, only the recording's
    output is a live block (PyTorch's test_execution_into_recording)."""
    compiled = torch.compile(_cubed, mode="reduce-overhead")
    x = torch.rand(4, device="cuda")
    before = _graph_pool_blocks()
    with _refused_in_the_sanitizer(cuda_kind):
        warm = compiled(x)
        torch.compiler.cudagraph_mark_step_begin()
        recorded = compiled(x)
        assert _graph_pool_blocks() == before + 1
        torch.testing.assert_close(recorded, _cubed(x))
        del recorded
        assert _graph_pool_blocks() == before
        del warm


@needs_access_errors
def test_reduce_overhead_runs_through_torchs_own_trees(cuda_kind):
    """On a CUDA build of torch a reduce-overhead graph is a function of torch's own cudagraph
    trees, whose manager numbers its recordings (warm-up, one recording, replays), as natively;
    the emulated device replayed it through its own stand-in for the trees before 2026-12-07."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's cudagraph trees by name")
    if cuda_kind == "emulated" and not hasattr(torch.UntypedStorage, "_swap_data_ptr_"):
        pytest.skip("this torch (2.11) lacks UntypedStorage._swap_data_ptr_: the emulated device "
                    "keeps its stand-in for the trees")
    from torch._inductor.cudagraph_trees import get_container

    compiled = torch.compile(_cubed, mode="reduce-overhead")
    x = torch.rand(4, device="cuda")
    for _ in range(3):
        out = compiled(x)
    torch.testing.assert_close(out, _cubed(x))
    manager = get_container(torch.cuda.current_device()).tree_manager
    assert manager is not None
    assert manager.new_graph_id().id == 1


@needs_access_errors
def test_reduce_overhead_on_another_devices_tensors_runs_in_that_devices_trees(two_devices):
    """Inductor hands a graph to the cudagraph trees of the device it was compiled for, which route
    that device's allocations to their pool: a reduce-overhead function of cuda:1 tensors called
    with cuda:0 current warms up, records and replays in cuda:1's trees. The emulated device gave
    the trees the current device (0), and their warm-up's pool check failed ("These storage data
    ptrs are not allocated in pool"), from 2026-12-07 (torch's own trees) to the fix."""
    if two_devices == "emulated" and not hasattr(torch.UntypedStorage, "_swap_data_ptr_"):
        pytest.skip("this torch (2.11) lacks UntypedStorage._swap_data_ptr_: the emulated device "
                    "keeps its stand-in for the trees")
    from torch._inductor.cudagraph_trees import get_container

    compiled = torch.compile(_cubed, mode="reduce-overhead")
    x = torch.rand(4, device="cuda:1")
    assert torch.cuda.current_device() == 0
    for _ in range(3):  # warm-up, recording, replay
        out = compiled(x)
    assert out.device == torch.device("cuda:1")
    torch.testing.assert_close(out, _cubed(x))
    assert get_container(1).tree_manager is not None
    assert get_container(1).tree_manager.new_graph_id().id == 1
    assert get_container(0).tree_manager is None


def test_dynamos_cudagraphs_backend_records_a_training_forward_and_backward(cuda_kind):
    """Dynamo's `backend="cudagraphs"` wraps AOTAutograd's forward and backward graphs each in
    cudagraph trees. Until 2026-12-07 the emulated device ran a graph autograd differentiates
    under that backend op by op, never recorded (PyTorch's
    test_forward_backward_not_called_backend_cudagraphs found no trees' manager)."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses cudagraph trees by name")
    from torch._dynamo.utils import counters

    compiled = torch.compile(_cubed, backend="cudagraphs")
    counters.clear()
    for _ in range(4):  # warm-up, recording, replays
        x = torch.rand(4, device="cuda", requires_grad=True)
        compiled(x).sum().backward()
        torch.testing.assert_close(x.grad, 3 * x.detach() ** 2)
    # the forward copies `x` in at a replay, the backward its incoming gradient (the activations
    # it saved are static)
    assert counters["inductor"]["cudagraph_recorded_non_static_inputs"] == 2


def test_compiled_autograds_backward_is_recorded_with_its_parameters_static(cuda_kind):
    """Compiled autograd compiles the backward `loss.backward()` runs, inside the autograd engine,
    with the compile's own mode (reduce-overhead here: one recording, the parameter a static
    input; PyTorch's test_compiled_autograd_static_input_params). Until 2026-12-07 the emulated
    device's marking of the engine's results, a dispatch mode, made dynamo skip that graph, and
    its boxed inputs kept it from the device's graphs: it ran as plain code, never recorded."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's cudagraph trees by name")
    from torch._dynamo.utils import counters

    def backward(loss):
        loss.backward()

    model = torch.nn.Linear(10, 10, bias=False, device="cuda")
    x = torch.randn(10, 10, device="cuda")
    counters.clear()
    with torch._dynamo.config.patch(compiled_autograd=True):  # read by torch.compile itself
        backward = torch.compile(backward, mode="reduce-overhead")
        for _ in range(5):  # warm-up, recording, replays
            backward(model(x).sum())
            torch.testing.assert_close(model.weight.grad, x.sum(0).expand(10, 10))
            model.weight.grad = None
    # the recording copies in the two inputs that are not the parameter
    assert counters["inductor"]["cudagraph_recorded_non_static_inputs"] == 2


def test_a_thread_replays_into_its_own_trees_leaving_anothers_outputs(cuda_kind):
    """Inductor's cudagraphify keeps its trees' function per host thread (each thread's tree
    manager, with a pool of its own): a worker thread's replays of the same compiled function
    leave what the main thread's replay handed out as it was. Until 2026-12-08 the emulated
    device kept one recording per graph for every thread, and the worker's replay rewrote the
    main thread's output."""
    import threading

    compiled = torch.compile(_cubed, mode="reduce-overhead")
    with _refused_in_the_sanitizer(cuda_kind):
        x = torch.rand(64, device="cuda")
        for _ in range(3):  # warm-up, recording, replay
            held = compiled(x)
        seen: dict = {}

        def worker():
            y = torch.rand(64, device="cuda") + 5
            for step in range(3):
                out = compiled(y)
                seen[step] = torch.allclose(out, _cubed(y))

        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        assert seen == {0: True, 1: True, 2: True}
        torch.testing.assert_close(held, _cubed(x))
        again = compiled(x)  # the main thread's replay, as it was recorded
        assert again is held
