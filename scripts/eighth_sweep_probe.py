"""CUDA's own answers for the cases of the eighth sweep of public runtimes and bugs (docs/fidelity.md,
"An eighth sweep of public runtimes and bugs"): host reads inside ops the earlier sweeps did not
check (`segment_reduce` by lengths or offsets, `unique_consecutive`, `combinations`, `equal` of two
tensors, and ops found to read nothing: `searchsorted` with a sorter, `bucketize(out_int32=True)`,
`embedding_bag` with `padding_idx`, `grid_sample`, `cdist`, `take`/`put_`, reflect padding, ...),
integer division by zero (CUDA's values per op and dtype), ties and NaNs in sorting and selection,
and the capture API's corners (`make_graphed_callables` with unused inputs and sample args mixing
`requires_grad`, `capture_error_mode` with a second thread allocating and syncing, `keep_graph`
and `instantiate()`, the debug dump, one pool for graphs of several sizes).

Plain torch, no harness: run it on a GPU, `python scripts/eighth_sweep_probe.py` (all cases, each
in a process of its own, since a refused capture can leave CUDA's context unusable) or with case
names. Each case prints one line `case: answer`, with the emulated device's answer in brackets;
compare with `python scripts/eighth_sweep_probe.py --emulate` on a machine without a GPU."""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import warnings

import probe_cases
import torch
import torch.nn.functional as F

CASES, case = probe_cases.registry()

_outcome = probe_cases.outcome
_capture_verdict = probe_cases.capture_verdict
_flags_a_sync = probe_cases.flags_a_sync
_seeded = probe_cases.seeded


# --- host reads inside ops -------------------------------------------------------------------

@case
def segment_reduce_in_capture():
    """SegmentReduce.cpp: `lengths.min().item()` and a summed check unless unsafe; offsets unchecked."""
    data = _seeded(6)
    lengths, offsets = torch.tensor([2, 4], device="cuda"), torch.tensor([0, 2, 6], device="cuda")
    by_lengths = lambda: torch.segment_reduce(data, "sum", lengths=lengths)  # noqa: E731
    return (f"lengths: {_capture_verdict(by_lengths)}; lengths unsafe: "
            f"{_capture_verdict(lambda: torch.segment_reduce(data, 'sum', lengths=lengths, unsafe=True))}; "
            f"offsets: {_capture_verdict(lambda: torch.segment_reduce(data, 'max', offsets=offsets))}; "
            f"sync flagged (lengths, offsets): {_flags_a_sync(by_lengths)}, "
            f"{_flags_a_sync(lambda: torch.segment_reduce(data, 'max', offsets=offsets))} (decided "
            f"from source; emulated: refused as a sync, invalidated; captured; captured; True, False)")


@case
def ops_reading_device_data_in_capture():
    ids = torch.tensor([1, 1, 2, 2, 3, 1], device="cuda")
    x, y = _seeded(6), _seeded(6, seed=1)
    cases = {"unique_consecutive": lambda: torch.unique_consecutive(ids),
             "combinations": lambda: torch.combinations(ids, 2),
             "equal(x, y)": lambda: torch.equal(x, y),
             "to_sparse": lambda: x.to_sparse(),
             "to_sparse_csr": lambda: x[None].to_sparse_csr()}
    return (f"{ {n: _capture_verdict(c)[:60] for n, c in cases.items()} } (emulated: each refused "
            f"as a sync, the capture invalidated, but combinations captured on torch 2.14.1, whose "
            f"composite no longer selects by a mask; equal(x, x) answers without reading, captured)")


@case
def ops_reading_nothing_in_capture():
    ids = torch.tensor([1, 1, 2, 2, 3, 1], device="cuda")
    x = _seeded(6, 8)
    weight, bag_offsets = _seeded(5, 4), torch.tensor([0, 3], device="cuda")
    sorted_seq, sorter = torch.tensor([3.0, 1.0, 2.0], device="cuda"), torch.tensor([1, 2, 0], device="cuda")
    bounds = torch.tensor([-1.0, 0.0, 1.0], device="cuda")
    grid = torch.rand(1, 3, 3, 2, generator=torch.Generator().manual_seed(0)).cuda() * 2 - 1
    image = _seeded(1, 2, 4, 4)
    leaf = _seeded(6, 8).requires_grad_()
    cases = {
        "searchsorted(sorter)": lambda: torch.searchsorted(sorted_seq, x, sorter=sorter),
        "bucketize(out_int32)": lambda: torch.bucketize(x, bounds, out_int32=True),
        "embedding_bag(sum, padding_idx)": lambda: F.embedding_bag(ids, weight, bag_offsets, padding_idx=1),
        "embedding_bag(max, padding_idx)":
            lambda: F.embedding_bag(ids, weight, bag_offsets, mode="max", padding_idx=1),
        "grid_sample": lambda: F.grid_sample(image, grid, align_corners=False),
        "cdist": lambda: torch.cdist(x, x),
        "nan_to_num": lambda: torch.nan_to_num(x / 0),
        "diag_embed": lambda: torch.diag_embed(x),
        "triu_indices(device)": lambda: torch.triu_indices(5, 5, device="cuda"),
        "cartesian_prod": lambda: torch.cartesian_prod(ids[:3], ids[:2]),
        "take": lambda: x.take(ids),
        "put_(accumulate)": lambda: x.clone().put_(ids, torch.ones(6, device="cuda"), accumulate=True),
        "pad reflect": lambda: F.pad(x[None], (2, 2), mode="reflect"),
        "index_select backward": lambda: torch.autograd.grad(leaf.index_select(0, ids).sum(), leaf),
        "pdist": lambda: F.pdist(x),
        "logcumsumexp": lambda: torch.logcumsumexp(x, 1),
    }
    verdicts = {n: _capture_verdict(c) for n, c in cases.items()}
    odd = {n: v[:80] for n, v in verdicts.items() if v != "captured"}
    return (f"all captured but {odd} (emulated: all captured but searchsorted(sorter), refused as "
            f"a sync, invalidated)")


@case
def embedding_bag_index_out_of_range():
    """The CPU checks each index on the host; CUDA's kernel (EmbeddingBag.cu) reads it on the device."""
    weight = _seeded(5, 2)
    ids, offsets = torch.tensor([1, 9], device="cuda"), torch.tensor([0], device="cuda")

    def bag():
        out = F.embedding_bag(ids, weight, offsets)
        torch.cuda.synchronize()
        return out.tolist()

    return (f"{_outcome(bag)[:150]} (emulated: DeviceAssertError, an AcceleratorError: CUDA error: "
            f"device-side assert triggered, as measured on an H100)")


# --- dtype behaviours ------------------------------------------------------------------------

@case
def integer_division_by_zero():
    """No check in cuda/BinaryDivTruncKernel.cu, BinaryDivFloorKernel.cu, BinaryRemainderKernel.cu."""
    a = torch.tensor([7, -7], device="cuda")
    zero = torch.zeros(2, dtype=torch.long, device="cuda")
    answers = {}
    for dtype in (torch.int64, torch.int32, torch.uint8):
        x, z = a.to(dtype) if dtype != torch.uint8 else a.abs().to(dtype), zero.to(dtype)
        for name, op in (("trunc", lambda p, q: torch.div(p, q, rounding_mode="trunc")),
                         ("floor", lambda p, q: p // q), ("remainder", lambda p, q: p % q),
                         ("fmod", torch.fmod)):
            answers[f"{str(dtype)[6:]} {name}"] = _outcome(lambda: op(x, z).tolist())[3:]
    return (f"{answers} (emulated: no error; the values an H100 wrote with torch 2.11, but 0 for "
            f"floor from torch 2.13 on, whose div_floor_integer checks for a zero divisor)")


@case
def ties_and_nans_in_selection():
    values = torch.tensor([1.0, 3.0, 3.0, 3.0, 0.0], device="cuda")
    with_nan = torch.tensor([1.0, float("nan"), 0.0, float("nan")], device="cuda")
    return (f"argmax ties {values.argmax().item()}; argmax with nan {with_nan.argmax().item()}; "
            f"topk(2) ties {values.topk(2).indices.tolist()}; sort with nan "
            f"{with_nan.sort().indices.tolist()}; sort descending {with_nan.sort(descending=True).indices.tolist()}; "
            f"max(dim) with nan {with_nan[None].max(1).indices.tolist()} (emulated: 1; 1; [1, 3]; "
            f"[2, 0, 1, 3]; [1, 3, 0, 2]; [1]: CPU kernels; CUDA's topk tie order is the case's)")


# --- the capture API -------------------------------------------------------------------------

def _two_inputs(requires_grad_second: bool = True):
    linear = torch.nn.Linear(4, 4).cuda()

    class TwoInputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = linear

        def forward(self, x, second):
            return self.linear(x) * second if requires_grad_second is None else self.linear(x)

    x = _seeded(2, 4).requires_grad_()
    second = _seeded(2, 4, seed=1).requires_grad_(bool(requires_grad_second))
    return TwoInputs(), x, second


@case
def make_graphed_callables_unused_and_mixed_inputs():
    module, x, unused = _two_inputs()
    graphed = torch.cuda.make_graphed_callables(module, (x, unused), allow_unused_input=True)
    graphed(x, unused).sum().backward()
    allowed = (x.grad is not None, unused.grad)
    module, x, unused = _two_inputs()
    refused = _outcome(lambda: torch.cuda.make_graphed_callables(module, (x, unused)))
    module, x, scale = _two_inputs(requires_grad_second=None)
    x.requires_grad_(False)
    scale.requires_grad_()
    graphed = torch.cuda.make_graphed_callables(module, (x, scale))
    new_x, new_scale = _seeded(2, 4, seed=2), _seeded(2, 4, seed=3).requires_grad_()
    graphed(new_x, new_scale).sum().backward()
    mixed = torch.allclose(new_scale.grad, module.linear(new_x)), new_x.grad
    return (f"allow_unused_input: x.grad set {allowed[0]}, unused.grad {allowed[1]}; without it: "
            f"{refused[:90]}; a plain input and one requiring grad: grad right {mixed[0]}, plain's "
            f"{mixed[1]} (emulated: True, None; RuntimeError: The differentiated Tensor at index 1 "
            f"appears to not have been used in the graph...; True, None)")


def _second_thread_in_capture(mode: str, work) -> str:
    state = torch.zeros(4, device="cuda")
    seen: list[str] = []

    def other():
        try:
            seen.append(repr(work()))
        except Exception as error:  # noqa: BLE001
            seen.append(f"{type(error).__name__}: {str(error).splitlines()[0][:60]}")

    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, capture_error_mode=mode):
            state.add_(1)
            thread = threading.Thread(target=other)
            thread.start()
            thread.join()
        graph.replay()
        torch.cuda.synchronize()
        ended = f"replayed {state.tolist()}"
    except RuntimeError as error:
        ended = f"{type(error).__name__}: {str(error).splitlines()[0][:60]}"
    return f"thread {seen}, {ended}"


@case
def capture_error_modes_with_a_second_thread():
    allocate = lambda: torch.empty(1000, device="cuda").fill_(1).shape  # noqa: E731
    new_segment = lambda: torch.empty((64 << 20) + 512, dtype=torch.uint8, device="cuda").shape  # noqa: E731
    read = lambda: torch.ones(3, device="cuda").sum().item()  # noqa: E731
    works = (("allocates in a live segment", allocate), ("allocates a new segment", new_segment),
             ("reads", read))
    return (f"{ {f'{m} {n}': _second_thread_in_capture(m, w) for m in ('global', 'thread_local', 'relaxed') for n, w in works} } "
            f"(emulated: an allocation in a live segment fine in all three; a new segment and the "
            f"read refused in global (UnsafeCallError / CaptureError: operation not permitted), the "
            f"capture invalidated; both fine in thread_local and relaxed)")


@case
def keep_graph_instantiate_and_debug_dump():
    x = torch.zeros(3, device="cuda")
    kept = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(kept):
        y = x * 2
    x.fill_(3)
    kept.replay()  # without instantiate(): replay instantiates
    first = y.tolist()
    kept.instantiate()
    plain = torch.cuda.CUDAGraph()
    with torch.cuda.graph(plain):
        z = x + 1
    instantiate_plain = _outcome(lambda: plain.instantiate())
    raw_plain = _outcome(lambda: plain.raw_cuda_graph())
    debug = torch.cuda.CUDAGraph()
    debug.enable_debug_mode()
    with torch.cuda.graph(debug):
        x * 3
    path = os.path.join(tempfile.mkdtemp(), "graph.dot")
    debug.debug_dump(path)
    written = os.path.exists(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plain_dump = _outcome(lambda: plain.debug_dump(os.path.join(tempfile.mkdtemp(), "plain.dot")))
    del z
    return (f"kept replay {first}; instantiate() without keep_graph: {instantiate_plain[:90]}; "
            f"raw_cuda_graph() without it: {raw_plain[:80]}; debug dump written {written}; dump "
            f"without debug mode: {plain_dump[:60]}, warns {[str(w.message)[:50] for w in caught]} "
            f"(emulated, torch 2.13: [6.0, 6.0, 6.0]; RuntimeError: instantiate() is intended to be "
            f"called by the user only when keep_graph=true; RuntimeError: You cannot access the raw "
            f"cudaGraph_t instance unless CUDAGraph was initialized with keep_graph=true; True; ok "
            f"None, warns ['CUDA Graphs debug not enabled, set with [graph].enable_debug_mode()']; "
            f"torch 2.14.1: the raw graph and the dump without keep_graph 'No cudaGraph_t is "
            f"available: ...', no warning)")


@case
def one_pool_for_graphs_of_several_sizes():
    pool = torch.cuda.graph_pool_handle()
    sizes = (8, 4, 2, 1)
    inputs = {n: _seeded(n, 8, seed=n) for n in sizes}
    outputs, graphs = {}, {}
    for n in sizes:  # largest first, as runtimes capture their batch sizes
        graphs[n] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[n], pool=pool):
            outputs[n] = (inputs[n] * 2).relu() + 1
    right = []
    for n in sizes:
        inputs[n].copy_(_seeded(n, 8, seed=10 + n))
        graphs[n].replay()
        right.append(torch.allclose(outputs[n], (inputs[n] * 2).relu() + 1))
    return f"each replay right, in capture order: {right} (emulated: [True, True, True, True])"


if __name__ == "__main__":
    probe_cases.run(CASES, __file__, sys.argv[1:], answer=probe_cases.whole_answer)
