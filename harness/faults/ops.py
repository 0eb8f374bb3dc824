"""Faults planted in the attention ops and their metadata (harness.ops)."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from harness.faults.patching import replace_function, replace_method
from harness.faults.registry import Fault, FaultHandle
from harness.graphs.emulator.pool import laid_out_like
from harness.ops import attention
from harness.ops.metadata import AttentionMetadata
from harness.ops.sizing import cdiv


def _pad_slot(kv_layer: torch.Tensor) -> int:
    """The first slot of the pad sink (the layer's last block)."""
    return (kv_layer.shape[1] - 1) * kv_layer.shape[2]


@contextlib.contextmanager
def pad_rows_write_real_kv(handle: FaultHandle) -> Iterator[None]:
    def make(write_kv):
        def planted(kv_layer, k, v, slot_mapping):
            handle.fire()
            # The pad sink's slot taken modulo the real slots: padded tokens land in slot 0.
            return write_kv(kv_layer, k, v, slot_mapping.remainder(_pad_slot(kv_layer)))
        return planted

    with replace_function(attention, "write_kv", make):
        yield


@contextlib.contextmanager
def pad_slot_minus_one_wraps(handle: FaultHandle) -> Iterator[None]:
    def make(write_kv):
        def planted(kv_layer, k, v, slot_mapping):
            handle.fire()
            pad_slot = _pad_slot(kv_layer)
            # PAD_SLOT_ID = -1 and Python-style indexing over the real slots: -1 is the last one.
            slots = torch.where(slot_mapping >= pad_slot, -1, slot_mapping)
            real = kv_layer[:, :-1].flatten(1, 2)
            real[0][slots] = k
            real[1][slots] = v
        return planted

    with replace_function(attention, "write_kv", make):
        yield


@contextlib.contextmanager
def pad_nan_leaks_into_real_rows(handle: FaultHandle) -> Iterator[None]:
    def make(dense_attention):
        def planted(q, keys, values, hidden, scale):
            handle.fire()
            # Masks by multiplying: a hidden position's value still enters the sum as 0 * value,
            # and 0 * NaN from a padded row's K/V is NaN. (Read before the real op zeroes them.)
            leaked = (values * hidden[None, :, :, None] * 0.0).sum(dim=2, keepdim=True)  # [KVH, T, 1, D]
            return dense_attention(q, keys, values, hidden, scale) + leaked
        return planted

    with replace_function(attention, "dense_attention", make):
        yield


@contextlib.contextmanager
def attention_returns_new_tensor(handle: FaultHandle) -> Iterator[None]:
    def make(paged_attention):
        def planted(q, k, v, kv_layer, metadata, scale, out, workspace=None, plan=None):
            handle.fire()
            fresh = torch.empty_like(out)
            paged_attention(q, k, v, kv_layer, metadata, scale, fresh, workspace, plan)
            return fresh
        return planted

    with replace_function(attention, "paged_attention", make):
        yield


@contextlib.contextmanager
def host_sync_in_capture(handle: FaultHandle) -> Iterator[None]:
    def make(check_inputs):
        def planted(q, k, v, kv_layer, metadata, out):
            check_inputs(q, k, v, kv_layer, metadata, out)
            handle.fire()
            # A host-side max_seqlen, as kernels that size their grid from it read it.
            int(metadata.seq_lens.max().item())
        return planted

    with replace_function(attention, "check_inputs", make):
        yield


@contextlib.contextmanager
def metadata_rebound(handle: FaultHandle) -> Iterator[None]:
    def make(prepare):
        kept = []

        def planted(self, spans, **kwargs):
            handle.fire()
            # Fresh buffers per batch: prepare copies into new ones and rebinds every buffer, so a
            # graph captured earlier keeps reading the old ones. They stay referenced here, so the
            # stale reads are of capture-time values on every backend (freed metadata on CUDA would
            # hand garbage indices to the kernels and trip a device-side assert instead).
            kept.append(self.flat)
            fresh = self.flat.clone()
            for name in AttentionMetadata.BUFFERS:  # every buffer, a view of the flat one
                old = getattr(self, name)
                setattr(self, name, laid_out_like(fresh.untyped_storage(), old))
            self.flat = fresh
            return prepare(self, spans, **kwargs)
        return planted

    with replace_method(AttentionMetadata, "prepare", make):
        yield


@contextlib.contextmanager
def max_seq_len_baked(handle: FaultHandle) -> Iterator[None]:
    longest: dict[int, int] = {}

    def make_prepare(prepare):
        def planted(self, spans, **kwargs):
            longest[id(self)] = max((span.seq_len for span in spans), default=1)
            return prepare(self, spans, **kwargs)
        return planted

    def make_attention(paged_attention):
        def planted(q, k, v, kv_layer, metadata, scale, out, workspace=None, plan=None):
            handle.fire()
            # The kernel reads as many KV blocks as the batch's longest sequence needs, a Python int
            # taken on the host when the step runs: a graph keeps the capture batch's value.
            max_seq_len = longest.get(id(metadata), metadata.max_blocks_per_seq * metadata.block_size)
            blocks = cdiv(max_seq_len, metadata.block_size)
            slots, positions, token_to_seq, seq_lens, block_tables = metadata.op_inputs()
            attention.paged_attention_op(q, k, v, kv_layer, slots, positions, token_to_seq, seq_lens,
                                         block_tables[:, :blocks], scale, out, None)
            return out
        return planted

    with replace_method(AttentionMetadata, "prepare", make_prepare), \
            replace_function(attention, "paged_attention", make_attention):
        yield


# The compiled path's traced body (runtime/piecewise/model.py, the compiled decode step and the
# compiled prefill pieces) calls `paged_attention_op` with the metadata's tensors and its `out`;
# only the eager model's attention call goes through the `paged_attention` wrapper.
EAGER_WRAPPER = ("the compiled path's traced body calls paged_attention_op directly, with the "
                 "metadata's tensors and its out, so no graph of that path runs ")


OPS_FAULTS = (
    Fault(
        name="pad-rows-write-real-kv",
        bug_class="padded token rows write their K/V into a real KV slot instead of the pad sink",
        link="https://github.com/vllm-project/vllm/issues/43810",
        detector="suites/ops/test_attention.py::test_nan_padding_writes_only_the_pad_sink",
        expected=r"padded rows wrote real KV slots \[0\]",
        plant=pad_rows_write_real_kv,
    ),
    Fault(
        name="pad-slot-minus-one-wraps",
        bug_class="a pad slot id of -1 wraps to the last real KV slot under Python indexing",
        link="https://github.com/vllm-project/vllm/pull/13922",
        detector="suites/ops/test_attention.py::test_nan_padding_writes_only_the_pad_sink",
        expected=r"padded rows wrote real KV slots \[(\d+)\] \(the last real slot is \1\)",
        plant=pad_slot_minus_one_wraps,
    ),
    Fault(
        name="pad-nan-leaks-into-real-rows",
        bug_class="padding is masked by multiplying, so 0 * NaN from padded rows' K/V leaks into "
                  "real rows",
        link="https://github.com/sgl-project/sglang/pull/32477",
        detector="suites/ops/test_attention.py::test_nan_padding_leaves_real_rows_unchanged",
        expected=r"padded rows leaked into real rows: rows \[\d+",
        plant=pad_nan_leaks_into_real_rows,
    ),
    Fault(
        name="attention-returns-new-tensor",
        bug_class="the in-place attention op returns a new tensor instead of writing its `out`, "
                  "so whatever reads `out`'s address never sees the result",
        link="https://github.com/vllm-project/vllm/pull/53915",
        detector="suites/ops/test_capture.py::test_replay_writes_the_callers_out",
        expected=r"returned a new tensor instead of writing its `out`",
        plant=attention_returns_new_tensor,
        not_on_compiled_path=EAGER_WRAPPER + ("attention.paged_attention, the eager model's wrapper "
                                              "the fault returns a new tensor from"),
    ),
    Fault(
        name="host-sync-in-capture",
        bug_class="a host sync (`.item()` of the longest sequence length) inside a captured segment",
        link="https://github.com/vllm-project/vllm/issues/48749",
        detector="suites/ops/test_capture.py::test_capture_then_replay_equals_eager[dense]",
        expected=r"operation not permitted when stream is capturing|cannot be captured: reads "
                 r"device data on the host \(a sync\)",
        plant=host_sync_in_capture,
        not_on_compiled_path=EAGER_WRAPPER + ("attention.check_inputs, which only the eager wrapper "
                                              "(paged_attention) and the sparse op call, where the "
                                              "fault reads .item()"),
    ),
    Fault(
        name="metadata-rebound",
        bug_class="AttentionMetadata.prepare copies each batch into fresh buffers and rebinds them "
                  "instead of copying into the captured ones, so a captured step reads the "
                  "capture-time metadata (or, once the old buffers are freed, whatever took their "
                  "address)",
        link="https://github.com/sgl-project/sglang/pull/26019",
        detector="suites/model/test_capturable.py::test_decode_graph_replays_match_eager",
        expected=r"(?s)(step \d+: \w+ divergence: |memory was freed after capture: the tensor of [^{]).*"
                 r"rebound after capture: [^\n]*metadata\.seq_lens",
        plant=metadata_rebound,
    ),
    Fault(
        name="max-seq-len-baked",
        bug_class="a Python scalar (the batch's longest sequence, which sizes the attention "
                  "kernel's context) is read on the host and baked into the captured decode step",
        link="https://github.com/Dao-AILab/flash-attention/issues/1164",
        detector="suites/decoder/test_two_pass.py::"
                 "test_two_pass_generation_matches_eager_and_replays_every_key",
        expected=r"request \d+, step \d+: (token|logprob|top|length) divergence: ",
        plant=max_seq_len_baked,
        not_on_compiled_path=EAGER_WRAPPER + ("attention.paged_attention, the eager model's wrapper, "
                                              "where the fault slices the block table by the host's "
                                              "longest sequence"),
    ),
)
