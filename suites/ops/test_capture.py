"""The ops are capture-safe: no host reads of device data, a fake for tracing, and graph replay on
the backend under test (emulated on CPU) gives exactly the eager result."""

from __future__ import annotations

from typing import Callable

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.ops import Workspace, block_sparse_attention, paged_attention
from harness.ops.attention import paged_attention_impl, paged_attention_op
from harness.ops.sparse_attention import block_sparse_attention_impl, block_sparse_attention_op
from suites.ops.batches import Batch, make_batch

SCALE = 0.35
LENGTHS = [(6, 6), (9, 3), (10, 1), (4, 1)]


class HostSyncGuard(TorchDispatchMode):
    """Raises on any aten op that needs device data on the host: what a graph cannot record."""

    SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "item", "equal", "is_nonzero"}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name == "index":  # integer indexing is static; only a boolean mask needs nonzero
            indices = args[1] if len(args) > 1 else ()
            syncs = any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)
        else:
            syncs = name in self.SYNC_OPS or torch.Tag.dynamic_output_shape in func.tags
        if syncs:
            raise RuntimeError(f"host read of device data: aten.{name}")
        return func(*args, **(kwargs or {}))


def op_args(batch: Batch) -> dict:
    md = batch.metadata
    n = md.num_tokens
    return dict(q=batch.q, k=batch.k, v=batch.v, kv_layer=batch.cache.layer(0),
                slot_mapping=md.slot_mapping[:n], positions=md.positions[:n],
                token_to_seq=md.token_to_seq[:n], seq_lens=md.seq_lens,
                block_tables=md.block_tables, scale=SCALE, out=torch.empty_like(batch.q))


def planted_item(**kw) -> None:
    longest = int(kw["seq_lens"].max())  # a host read: the shape would be frozen at capture
    paged_attention_impl(scratch=None, **kw)
    kw["out"][:, :, :longest].mul_(1)


def planted_bool_mask(**kw) -> None:
    paged_attention_impl(scratch=None, **kw)
    real = kw["out"][kw["seq_lens"][kw["token_to_seq"]] > 0]  # boolean indexing syncs
    real.mul_(1)


@pytest.mark.parametrize("impl", [
    lambda **kw: paged_attention_impl(scratch=None, **kw),
    lambda **kw: block_sparse_attention_impl(top_k=2, **kw),
], ids=["dense", "sparse"])
def test_op_bodies_read_no_device_data_on_the_host(impl) -> None:
    batch = make_batch(LENGTHS, pad_tokens=2, pad_seqs=1)
    with HostSyncGuard():
        impl(**op_args(batch))


@pytest.mark.parametrize("planted", [planted_item, planted_bool_mask], ids=["item", "bool-mask"])
def test_guard_catches_planted_host_reads(planted) -> None:
    batch = make_batch(LENGTHS, pad_tokens=2, pad_seqs=1)
    with pytest.raises(RuntimeError, match="host read of device data"), HostSyncGuard():
        planted(**op_args(batch))


def test_opcheck_schema_and_fakes() -> None:
    batch = make_batch([(5, 5), (7, 1)], pad_tokens=1)
    args = op_args(batch)
    md = batch.metadata
    context = md.max_blocks_per_seq * md.block_size
    scratch = torch.empty(2 * md.num_tokens * context * batch.k[0].numel(), dtype=torch.bfloat16)
    dense = [args[name] for name in ("q", "k", "v", "kv_layer", "slot_mapping", "positions",
                                     "token_to_seq", "seq_lens", "block_tables", "scale", "out")]
    torch.library.opcheck(paged_attention_op, (*dense, scratch),
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(block_sparse_attention_op, (*dense[:-1], 2, args["out"]),
                          test_utils=("test_schema", "test_faketensor"))


def run_dense(batch: Batch, out: torch.Tensor) -> torch.Tensor:
    return paged_attention(batch.q, batch.k, batch.v, batch.cache.layer(0), batch.metadata, SCALE,
                           out)


def run_dense_workspace(workspace: Workspace) -> Callable[[Batch, torch.Tensor], torch.Tensor]:
    def run(batch: Batch, out: torch.Tensor) -> torch.Tensor:
        return paged_attention(batch.q, batch.k, batch.v, batch.cache.layer(0), batch.metadata,
                               SCALE, out, workspace)
    return run


def run_sparse(batch: Batch, out: torch.Tensor) -> torch.Tensor:
    return block_sparse_attention(batch.q, batch.k, batch.v, batch.cache.layer(0), batch.metadata,
                                  SCALE, out, 2)


@pytest.mark.parametrize("variant", ["dense", "dense-workspace", "sparse"])
def test_capture_then_replay_equals_eager(graph_backend, device, variant) -> None:
    def runner() -> Callable[[Batch, torch.Tensor], torch.Tensor]:
        if variant == "dense-workspace":
            return run_dense_workspace(Workspace(torch.bfloat16, device))
        return run_dense if variant == "dense" else run_sparse

    def batch() -> Batch:
        return make_batch(LENGTHS, pad_tokens=2, pad_seqs=1, device=device)

    captured = batch()
    cache_before = captured.cache.tensor.clone()
    out = torch.zeros_like(captured.q)
    run_captured = runner()
    warmup = batch()  # as every capture wants: cuBLAS makes its handle on first use, never in a capture
    run_captured(warmup, torch.zeros_like(warmup.q))
    graph = graph_backend.capture(lambda: run_captured(captured, out))
    graph_backend.synchronize()
    assert torch.equal(captured.cache.tensor, cache_before), "capture must run nothing"
    assert torch.isfinite(captured.cache.tensor).all()

    # Two replays: the first batch, then new q/k/v copied into the same input tensors.
    for scale_inputs in (1.0, -1.5):
        eager = batch()
        for name in ("q", "k", "v"):
            new = getattr(eager, name) * scale_inputs
            setattr(eager, name, new)
            getattr(captured, name).copy_(new)
        expected = runner()(eager, torch.zeros_like(eager.q))
        graph.replay()
        graph_backend.synchronize()
        assert torch.equal(out, expected)
        # exact, NaN included: the padded rows' NaN K/V sit in the pad sink of both
        torch.testing.assert_close(captured.cache.tensor, eager.cache.tensor, rtol=0, atol=0,
                                   equal_nan=True)


def test_replay_writes_the_callers_out(graph_backend, device) -> None:
    # The model (and a piecewise graph's next segment) reads the result at `out`'s address, so the
    # wrapper must write there and hand back that very tensor.
    captured = make_batch(LENGTHS, pad_tokens=2, pad_seqs=1, device=device)
    eager = make_batch(LENGTHS, pad_tokens=2, pad_seqs=1, device=device)
    out = torch.zeros_like(captured.q)
    run_dense(eager, torch.zeros_like(eager.q))  # the warmup a capture wants (cuBLAS's handle)
    graph = graph_backend.capture(lambda: run_dense(captured, out))
    graph.replay()
    graph_backend.synchronize()
    assert graph.output is out, (
        "paged_attention returned a new tensor instead of writing its `out`: whatever reads "
        "`out`'s address after the op (the next layer, the next graph segment) never sees the result")
    assert torch.equal(out, run_dense(eager, torch.zeros_like(eager.q)))


@pytest.mark.parametrize("impl", [
    pytest.param(lambda **kw: paged_attention_impl(scratch=None, **kw), id="dense"),
    pytest.param(lambda **kw: block_sparse_attention_impl(top_k=3, **kw), id="sparse"),
])
def test_op_bodies_capture_op_by_op(graph_backend, device, impl) -> None:
    # Not opaque: every aten op of the body is recorded, so a host read or an allocation that
    # escapes the graph would surface here, not just in the HostSyncGuard above.
    eager = make_batch(LENGTHS, pad_tokens=2, pad_seqs=1, max_blocks_per_seq=4, device=device)
    captured = make_batch(LENGTHS, pad_tokens=2, pad_seqs=1, max_blocks_per_seq=4, device=device)
    eager_args, captured_args = op_args(eager), op_args(captured)
    impl(**eager_args)
    graph = graph_backend.capture(lambda: impl(**captured_args))
    graph.replay()
    graph_backend.synchronize()
    assert torch.equal(captured_args["out"], eager_args["out"])


def test_torch_compile_traces_the_op_as_one_node() -> None:
    # The piecewise backend splits dynamo's graph at these nodes, so each op must stay one opaque
    # call (fullgraph: no graph break around it) and the compiled result must match eager.
    targets: list[str] = []

    def record(gm: torch.fx.GraphModule, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    def step(batch: Batch, out: torch.Tensor) -> torch.Tensor:
        attended = paged_attention(batch.q * 2, batch.k, batch.v, batch.cache.layer(0),
                                   batch.metadata, SCALE, out)
        return attended.sum(-1)

    compiled, eager = make_batch(LENGTHS, pad_tokens=1), make_batch(LENGTHS, pad_tokens=1)
    result = torch.compile(step, backend=record, fullgraph=True)(
        compiled, torch.empty_like(compiled.q))
    assert torch.equal(result, step(eager, torch.empty_like(eager.q)))
    assert targets.count("harness.paged_attention.default") == 1


def test_replay_follows_metadata_prepared_after_capture(graph_backend, device) -> None:
    # A decode graph captured once serves later steps: longer sequences, new slots, a batch that
    # shrinks into padding. It sees them only because prepare() copies into the same buffers.
    from harness.ops import AttentionMetadata, PagedKVCache, SequenceSpan

    def state():
        cache = PagedKVCache(1, 12, 4, 2, 8, torch.bfloat16, device)
        cache.tensor.copy_(torch.randn(cache.tensor.shape, generator=torch.Generator().manual_seed(1)))
        return cache, AttentionMetadata(4, 4, 3, 4, cache.pad_slot, device)

    tables = [[7, 2, 9], [0, 4], [11, 5, 1]]
    starts = [6, 3, 9]
    graph_cache, graph_md = state()
    eager_cache, eager_md = state()
    q = torch.zeros(4, 4, 8, dtype=torch.bfloat16, device=device)
    k, v = torch.zeros(2, 4, 2, 8, dtype=torch.bfloat16, device=device)
    out = torch.empty_like(q)
    graph_md.prepare([SequenceSpan(s, 1, t) for s, t in zip(starts, tables)], num_tokens=4,
                     num_seqs=4)
    # On CUDA a thread's first matmul creates its cuBLAS handle, which a capture refuses
    # (CUBLAS_STATUS_NOT_INITIALIZED): a runtime warms it up before capturing, as here.
    warm = torch.ones(2, 2, dtype=torch.bfloat16, device=device)
    warm @ warm
    graph = graph_backend.capture(
        lambda: paged_attention(q, k, v, graph_cache.layer(0), graph_md, SCALE, out))
    gen = torch.Generator().manual_seed(2)
    for step, live in enumerate((3, 3, 2)):
        spans = [SequenceSpan(s + step, 1, t) for s, t in zip(starts[:live], tables[:live])]
        inputs = [torch.randn(4, heads, 8, generator=gen).to(torch.bfloat16).to(device)
                  for heads in (4, 2, 2)]
        for tensor in inputs:
            tensor[live:] = float("nan")  # padded rows
        for md in (graph_md, eager_md):
            md.prepare(spans, num_tokens=4, num_seqs=4)
        for static, new in zip((q, k, v), inputs):
            static.copy_(new)
        graph.replay()
        graph_backend.synchronize()
        expected = paged_attention(*inputs, eager_cache.layer(0), eager_md, SCALE,
                                   torch.empty_like(out))
        assert torch.equal(out, expected), f"step {step}"
        torch.testing.assert_close(graph_cache.tensor, eager_cache.tensor, rtol=0, atol=0,
                                   equal_nan=True)
