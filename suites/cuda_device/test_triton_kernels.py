"""Users' Triton kernels on the emulated CUDA device (runtimes launch their own on "cuda" tensors:
nano-vllm's store_kvcache, vLLM's and SGLang's kernels). A launch runs through Triton's interpreter
as one device op on the current stream: its result is CUDA's, the stream tracking sees its reads
and writes, a capture records it and each replay runs it again with the arguments of the capture,
an autotuned kernel picks a config without benchmarking, and leaving the emulation gives triton
back as it was. Where triton is not installed (the CPU wheel), every test here skips."""

from __future__ import annotations

import importlib
import pathlib

import pytest
import torch

import harness
from harness.emulation import emulation_active
from harness.emulation.tracking import RaceError

NO_TRITON = "triton is not installed (the CPU wheel has none); the CUDA wheel's runs these"


@pytest.fixture
def kernels():
    pytest.importorskip("triton", reason=NO_TRITON)
    return importlib.import_module("suites.cuda_device._triton_kernels")


@pytest.fixture
def triton_where(cuda_kind):
    """The emulated device, or a GPU natively; the graph sanitizer records what reaches torch's
    dispatcher, and a compiled Triton launch does not."""
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer does not see a compiled Triton launch (it bypasses "
                    "torch's dispatcher)")
    return cuda_kind


@pytest.fixture
def tracked(cuda_device):
    torch.cuda.Stream()  # the first stream made turns tracking on
    return cuda_device


def _kv_case(rows: int = 3, dim: int = 8, slots: int = 6, dtype=torch.bfloat16):
    generator = torch.Generator().manual_seed(0)
    key = torch.randn(rows, dim, generator=generator).to(dtype).to("cuda")
    value = torch.randn(rows, dim, generator=generator).to(dtype).to("cuda")
    k_cache = torch.zeros(slots, dim, dtype=dtype, device="cuda")
    v_cache = torch.zeros(slots, dim, dtype=dtype, device="cuda")
    slot_mapping = torch.tensor([4, -1, 1][:rows], device="cuda")
    return key, value, k_cache, v_cache, slot_mapping


def _store(kernels, key, value, k_cache, v_cache, slot_mapping) -> None:
    kernels.store_kvcache_kernel[(key.shape[0],)](key, key.stride(0), value, value.stride(0),
                                                  k_cache, v_cache, slot_mapping, key.shape[1])


def _reference(key, value, k_cache, v_cache, slot_mapping):
    """What the kernel must leave: torch's indexed writes of the rows that have a slot."""
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    has_slot = slot_mapping != -1
    k_ref[slot_mapping[has_slot]] = key[has_slot]
    v_ref[slot_mapping[has_slot]] = value[has_slot]
    return k_ref, v_ref


def test_a_store_kernel_writes_the_cache_rows_as_torch_does(kernels, triton_where):
    key, value, k_cache, v_cache, slot_mapping = _kv_case()
    k_ref, v_ref = _reference(key, value, k_cache, v_cache, slot_mapping)
    _store(kernels, key, value, k_cache, v_cache, slot_mapping)
    torch.cuda.synchronize()
    assert k_cache.is_cuda
    assert torch.equal(k_cache.cpu(), k_ref.cpu()) and torch.equal(v_cache.cpu(), v_ref.cpu())


def test_a_loop_bounded_by_a_scalar_argument_runs(kernels, triton_where):
    """triton 3.6's interpreter reads a scalar's index with int() of a one-element array, which
    numpy 2.4 refuses: every decode GEMV failed with the GPU hidden on torch 2.11's wheel."""
    x = torch.arange(11, dtype=torch.float32, device="cuda")
    out = torch.zeros(1, device="cuda")
    kernels.blocked_sum_kernel[(1,)](x, out, 11, BLOCK=4)
    assert out.item() == 55.0


def test_a_mask_anded_with_a_scalar_comparison_loads_and_stores(kernels, triton_where):
    """triton 3.9's interpreter keeps such a mask's data as int32 and its C++ load refused it
    ("mask has unsupported dtype"): the paged-decode kernel failed on torch 2.15's wheel."""
    x = torch.arange(1.0, 7.0, device="cuda")
    out = torch.zeros(8, device="cuda")
    kernels.masked_copy_kernel[(1,)](x, out, 6, 0, 1, BLOCK=8)
    assert out.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.0, 0.0]
    empty_run = torch.full((8,), -1.0, device="cuda")
    kernels.masked_copy_kernel[(1,)](x, empty_run, 6, 1, 1, BLOCK=8)
    assert empty_run.tolist() == [-1.0] * 8


def test_a_captured_launch_reruns_at_each_replay_with_its_captured_arguments(kernels, triton_where):
    x = torch.arange(6.0, device="cuda").reshape(2, 3)
    out = torch.zeros(4, 3, device="cuda")
    slots = torch.tensor([3, 0], device="cuda")
    launch = kernels.scaled_store_kernel[(2,)]
    launch(x, out, slots, 3, 2.0, BLOCK=4)  # warm up (compiles on a GPU)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(x, out, slots, 3, 2.0, BLOCK=4)
    other = torch.zeros(4, 3, device="cuda")
    launch(x, other, slots, 3, 5.0, BLOCK=4)  # the same kernel with another scale, after capture
    x.copy_(torch.full((2, 3), 7.0))
    slots.copy_(torch.tensor([1, 2]))
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    expected = torch.zeros(4, 3)
    expected[1] = expected[2] = 14.0  # the new rows at the new slots, times the captured 2.0
    assert torch.equal(out.cpu(), expected)
    assert torch.equal(other.cpu()[[3, 0]], torch.arange(6.0).reshape(2, 3) * 5.0)


def test_a_launch_into_a_capture_does_not_run_until_the_replay(kernels, cuda_device):
    x = torch.ones(2, 3, device="cuda")
    out = torch.zeros(2, 3, device="cuda")
    slots = torch.tensor([0, 1], device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernels.scaled_store_kernel[(2,)](x, out, slots, 3, 3.0, BLOCK=4)
    assert out.cpu().eq(0).all()
    graph.replay()
    assert out.cpu().eq(3.0).all()


def test_a_kernel_writing_on_a_side_stream_races_with_an_unwaited_read(kernels, tracked):
    key, value, k_cache, v_cache, slot_mapping = _kv_case()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _store(kernels, key, value, k_cache, v_cache, slot_mapping)
    with pytest.raises(RaceError, match="store_kvcache_kernel"):
        k_cache.sum()  # on the default stream, which did not wait for the side stream
    torch.cuda.synchronize()


def test_a_waited_read_of_the_kernels_output_is_no_race(kernels, tracked):
    key, value, k_cache, v_cache, slot_mapping = _kv_case()
    k_ref, _ = _reference(key, value, k_cache, v_cache, slot_mapping)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _store(kernels, key, value, k_cache, v_cache, slot_mapping)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(k_cache.cpu(), k_ref.cpu())


def test_two_kernels_only_reading_one_tensor_on_two_streams_do_not_race(kernels, tracked):
    key, value, k_cache, v_cache, slot_mapping = _kv_case()
    other_k, other_v = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _store(kernels, key, value, k_cache, v_cache, slot_mapping)
    # key, value and slot_mapping are read on both streams, with no wait between them
    _store(kernels, key, value, other_k, other_v, slot_mapping)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(k_cache.cpu(), other_k.cpu()) and torch.equal(v_cache.cpu(), other_v.cpu())


def test_a_write_through_a_jitted_helper_is_tracked(kernels, tracked):
    x = torch.ones(2, 3, device="cuda")
    out = torch.zeros(2, 3, device="cuda")
    slots = torch.tensor([0, 1], device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        kernels.scaled_store_kernel[(2,)](x, out, slots, 3, 2.0, BLOCK=4)
    x.sum()  # x is only read there: reading it on the default stream too is no race
    with pytest.raises(RaceError, match=r"scaled_store_kernel.* writes it on stream .* at "
                                        r"suites/cuda_device/test_triton_kernels.py:\d+"):
        out.add_(1)
    torch.cuda.synchronize()


def test_a_kernel_writes_an_inference_tensor_and_a_leaf_that_requires_grad(kernels, triton_where):
    """A Triton kernel writes memory as it is: autograd's in-place checks are not CUDA's here."""
    with torch.inference_mode():
        cache = torch.zeros(2, 3, device="cuda")
    leaf = torch.zeros(2, 3, device="cuda", requires_grad=True)
    x = torch.ones(2, 3, device="cuda")
    slots = torch.tensor([1, 0], device="cuda")
    for out in (cache, leaf):
        kernels.scaled_store_kernel[(2,)](x, out, slots, 3, 4.0, BLOCK=4)
    torch.cuda.synchronize()
    assert cache.cpu().eq(4.0).all() and leaf.detach().cpu().eq(4.0).all()


def test_an_autotuned_kernel_runs_with_its_first_config(kernels, triton_where):
    x = torch.arange(10.0, device="cuda")
    y = torch.full((10,), 0.5, device="cuda")
    out = torch.empty(10, device="cuda")
    kernels.autotuned_add_kernel[lambda meta: (triton_cdiv(10, meta["BLOCK"]),)](x, y, out, 10)
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), torch.arange(10.0) + 0.5)
    if triton_where == "emulated":  # a GPU keeps the faster one
        assert kernels.autotuned_add_kernel.best_config.kwargs == {"BLOCK": 4}


def test_a_heuristics_kernel_runs(kernels, triton_where):
    x = torch.arange(5.0, device="cuda")
    out = torch.zeros(1, device="cuda")
    kernels.heuristic_sum_kernel[(1,)](x, out, 5)
    torch.cuda.synchronize()
    assert out.item() == 10.0


def test_a_kernel_decorated_for_the_interpreter_is_a_device_op_too(kernels, tracked):
    """Under TRITON_INTERPRET=1 `triton.jit` makes InterpretedFunctions, whose own launcher would
    run at once: untracked, and at capture time instead of at each replay."""
    import triton

    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = True
        kernel = triton.jit(kernels.scaled_store_kernel.fn)
    assert type(kernel).__name__ == "InterpretedFunction"
    x = torch.ones(2, 3, device="cuda")
    out = torch.zeros(2, 3, device="cuda")
    slots = torch.tensor([0, 1], device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel[(2,)](x, out, slots, 3, 3.0, BLOCK=4)
    assert out.cpu().eq(0).all()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        graph.replay()
    with pytest.raises(RaceError):
        out.sum()
    torch.cuda.synchronize()
    assert out.cpu().eq(3.0).all()


def triton_cdiv(n: int, d: int) -> int:
    return -(-n // d)


def test_leaving_the_emulation_gives_triton_back(kernels, outside_emulation):
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    before = (JITFunction.run, JITFunction.__call__, InterpretedFunction.run, Autotuner.run)
    module_names = set(vars(kernels))
    with harness.emulate_cuda(device="cpu"):
        key, value, k_cache, v_cache, slot_mapping = _kv_case()
        _store(kernels, key, value, k_cache, v_cache, slot_mapping)
        assert JITFunction.run is not before[0]
    assert emulation_active() is None
    assert (JITFunction.run, JITFunction.__call__, InterpretedFunction.run, Autotuner.run) == before
    # the interpreter's own names went into a copy of the kernel's globals, not its module
    assert set(vars(kernels)) == module_names
    with pytest.raises(RuntimeError, match="outside of the scope of a kernel"):
        kernels._scaled_row(None, None, None, None, None)


def test_a_triton_missing_a_piece_is_refused_naming_its_version(kernels):
    import triton

    from harness import triton_internals

    def resolver(entry):
        if entry.attribute == "_patch_lang":
            raise AttributeError("module has no attribute '_patch_lang'")
        return triton_internals.resolve(entry)

    with pytest.raises(triton_internals.TritonInternalsError,
                       match=rf"triton {triton.__version__} lacks .*_patch_lang \(missing"):
        triton_internals.check(resolver=resolver)


def test_no_module_but_the_door_names_a_private_triton_name():
    """Every private triton name the harness reaches is resolved in triton_internals alone."""
    from harness import triton_internals

    harness_dir = pathlib.Path(harness.__file__).parent
    door = harness_dir / "triton_internals.py"
    private = {entry.attribute.split(".")[-1] for entry in triton_internals.NAMES.values()
               if entry.attribute.startswith("_")} | {"triton.runtime"}
    reached = [f"{path.relative_to(harness_dir.parent)}: {name}"
               for path in sorted(harness_dir.rglob("*.py")) if path != door
               for name in sorted(private) if name in path.read_text()]
    assert reached == []


def test_a_triton_without_the_registry_of_jitted_functions_is_complete(kernels):
    """triton 3.6 (torch 2.11's) keeps no registry of jitted functions, which 3.8 has; the harness
    does without it there. Refusing it refused emulate_cuda() itself on torch 2.11's CUDA wheel."""
    from harness import triton_internals

    def resolver(entry):
        if entry.attribute == "_triton_jit_function_registry":
            raise AttributeError("module 'triton.runtime.jit' has no attribute "
                                 "'_triton_jit_function_registry'")
        return triton_internals.resolve(entry)

    assert triton_internals.problems(resolver=resolver) == []


def test_a_triton_missing_a_piece_still_enters_and_refuses_only_device_launches(
        kernels, outside_emulation, monkeypatch):
    import triton

    from harness import triton_internals

    # an older or newer triton without one of the interpreter's private names
    monkeypatch.delattr(importlib.import_module("triton.runtime.interpreter"), "_patch_lang")
    with harness.emulate_cuda(device="cpu"):
        x = torch.arange(4.0, device="cuda")
        assert (x * 2).tolist() == [0.0, 2.0, 4.0, 6.0]  # the device works without Triton
        out = torch.zeros(4, device="cuda")
        with pytest.raises(triton_internals.TritonInternalsError,
                           match=rf"triton {triton.__version__} lacks .*_patch_lang \(missing"):
            kernels.scaled_store_kernel[(1,)](x, out, torch.arange(1, device="cuda"), 4, 2.0,
                                              BLOCK=4)
    assert out.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_a_triton_kernel_launched_in_a_compiled_function_runs_and_replays(kernels, cuda_device):
    """dynamo traces `kernel[grid](...)` into the graph; inductor compiles the device's graphs for
    the cpu, where triton has no backend ("triton not built with the 'cpu' backend" before). The
    launch is now the device's op for the kernel, run through the interpreter when the graph runs,
    also as part of a captured compiled function at each replay."""
    torch._dynamo.reset()
    slot = torch.tensor([0], device="cuda")

    def step(a):
        out = torch.zeros_like(a)
        kernels.scaled_store_kernel[(1,)](a, out, slot, 4, 2.0, BLOCK=4)
        return out + 1

    compiled = torch.compile(step)
    x = torch.arange(4.0, device="cuda").view(1, 4)
    assert compiled(x).tolist() == [[1.0, 3.0, 5.0, 7.0]]
    compiled(x)  # warm, as runtimes do before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = compiled(x)
    x.copy_(torch.full((1, 4), 10.0, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert out.tolist() == [[21.0, 21.0, 21.0, 21.0]]
    torch._dynamo.reset()


def test_a_triton_op_runs_eagerly_and_replays_from_a_capture(kernels, triton_where):
    """A `torch.library.triton_op` called eagerly launches its kernel as any launch. Captured,
    its body runs at each replay on the replay's aliases of the captured memory, which carry no
    device mark: the launch there went to triton's driver ("libcuda.so cannot found!" on the CUDA
    wheel without a GPU) before a launch met during a replay was the device's."""
    assert _eager_then_replayed(kernels.scaled_row, 10.0) == ([[0.0, 2.0, 4.0, 6.0]],
                                                               [[20.0, 20.0, 20.0, 20.0]])


def test_a_cuda_only_custom_op_launching_a_kernel_replays_from_a_capture(kernels, triton_where):
    """A runtime's op with only a CUDA kernel in Python, which launches a Triton kernel: captured
    as one op, run again at each replay, where its launch is the device's."""
    assert _eager_then_replayed(kernels.scaled_row_cuda, 5.0) == ([[0.0, 2.0, 4.0, 6.0]],
                                                                   [[10.0, 10.0, 10.0, 10.0]])


def _eager_then_replayed(op, fill: float) -> tuple[list, list]:
    """`op(x, slot)` eagerly on 0, 1, 2, 3, then captured and replayed with x filled with `fill`."""
    slot = torch.tensor([0], device="cuda")
    x = torch.arange(4.0, device="cuda").view(1, 4)
    eager = op(x, slot).tolist()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(x, slot)
    x.copy_(torch.full((1, 4), fill, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    return eager, out.tolist()


def test_a_triton_op_inside_a_compiled_function_runs_and_replays(kernels, triton_where):
    """AOTAutograd traces a triton_op into its kernel, which inductor, compiling the device's
    graphs for the cpu, has no triton backend for (refused by name before: "a user's Triton kernel
    inside a torch.compile'd function"). The device's compiles keep the op whole, as torch.export
    does; its kernel runs through the interpreter when the graph runs, in a capture of the
    compiled function at each replay, and under mode="reduce-overhead"."""
    torch._dynamo.reset()
    slot = torch.tensor([0], device="cuda")
    x = torch.arange(4.0, device="cuda").view(1, 4)
    compiled = torch.compile(lambda a, s: kernels.scaled_row(a, s) + 1)
    assert compiled(x, slot).tolist() == [[1.0, 3.0, 5.0, 7.0]]
    compiled(x, slot)  # warm, as runtimes do before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = compiled(x, slot)
    x.copy_(torch.full((1, 4), 10.0, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert out.tolist() == [[21.0, 21.0, 21.0, 21.0]]
    overhead = torch.compile(lambda a, s: kernels.scaled_row(a, s) * 3, mode="reduce-overhead")
    for value in (1.0, 2.0, 3.0):  # warm-up, capture, replay
        result = overhead(torch.full((1, 4), value, device="cuda"), slot)
        torch.cuda.synchronize()
        assert result.tolist() == [[6.0 * value] * 4]
    torch._dynamo.reset()


def test_a_launch_whose_grid_the_graph_computes_is_refused_by_name(kernels, cuda_device):
    """A grid computed inside the graph (from a dynamic size) is left to inductor, which has no
    cpu backend for the kernel: refused by name with the remedy, which works (the launching
    function kept out of the compiled region runs the kernel through the interpreter)."""
    torch._dynamo.reset()

    def step(a, slots):
        out = torch.zeros_like(a)
        kernels.scaled_store_kernel[(a.shape[0],)](a, out, slots, 4, 2.0, BLOCK=4)
        return out + 1

    x = torch.arange(8.0, device="cuda").view(2, 4)
    slots = torch.tensor([1, 0], device="cuda")
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.mark_dynamic(slots, 0)
    with pytest.raises(Exception, match="UnsupportedOnEmulatedDevice: a user's Triton kernel "
                                         "inside a torch.compile'd function"):
        torch.compile(step)(x, slots)
    torch._dynamo.reset()
    launched_eagerly = torch.compiler.disable(step)
    assert torch.compile(lambda a, s: launched_eagerly(a * 1, s) * 2)(x, slots).tolist() == [
        [18.0, 22.0, 26.0, 30.0], [2.0, 6.0, 10.0, 14.0]]
    torch._dynamo.reset()


def test_an_autotuned_launch_in_a_compiled_function_takes_the_first_config(kernels, cuda_device):
    torch._dynamo.reset()
    x, y = torch.arange(8.0, device="cuda"), torch.ones(8, device="cuda")

    def add(a, b):
        out = torch.empty_like(a)
        kernels.autotuned_add_kernel[(2,)](a, b, out, 8)  # BLOCK 4: two programs cover 8
        return out * 2

    assert torch.compile(add)(x, y).tolist() == [2.0 * (v + 1) for v in range(8)]
    torch._dynamo.reset()


def test_an_autotuned_launch_with_a_pre_hook_in_a_compiled_function_runs_eagerly(kernels,
                                                                                  triton_where):
    """dynamo does not trace an autotuner whose configs have a `pre_hook` ("pre_hook and
    post_hook are not supported in triton.Autotune or triton.Config"): a graph break, and the
    launch runs eagerly between two graphs, its frames offered to dynamo. The interpreter's frames
    were compiled there before and failed ("'constexpr' object has no attribute 'value'")."""
    torch._dynamo.reset()
    counters = importlib.import_module("torch._dynamo.utils").counters
    counters.clear()
    x, y = torch.arange(8.0, device="cuda"), torch.ones(8, device="cuda")

    def add(a, b):
        out = torch.ones_like(a)  # the pre_hook zeroes it before the kernel adds into it
        kernels.accumulated_add_kernel[lambda meta: (triton_cdiv(8, meta["BLOCK"]),)](
            a, b, out, 8)
        return out * 2

    assert torch.compile(add)(x, y).tolist() == [2.0 * (v + 1) for v in range(8)]
    assert any("pre_hook" in reason for reason in counters["graph_break"])
    torch._dynamo.reset()
