"""Faults the compiled path brings (harness.runtime.compiled, EngineConfig.compile="inductor").

Planted in the public functions the compiled path is made of: the token body and its per-token
inputs (runtime/piecewise/model.py, shared by the compiled decode step and the compiled prefill
pieces), where a piece's outputs are placed and the inductor options it is compiled with
(runtime/compiled/piece.py), and the decode graphs' warmup forward (DecoderGraphs.warmup_step).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from harness import torch_internals

from harness.faults.patching import replace_function, replace_method
from harness.faults.registry import Fault, FaultHandle
from harness.runtime.compiled import piece as compiled_piece
from harness.runtime.decode.decoder_graphs import DecoderGraphs
from harness.runtime.piecewise import model as piecewise_model

DETECT_DECODE = "suites/compiled/test_compiled_engine.py::test_compiled_decode_graphs_equal_the_eager_engine"
DETECT_PREFILL = ("suites/compiled/test_compiled_prefill.py::"
                  "test_compiled_prefill_replays_every_bucket_without_recompiling")
DIVERGED = r"compare_generations: FAILED, \d+ divergence\(s\)"


@dataclass
class HostCount:
    """The batch's real token count as the host knows it, where a planted body reads it."""

    value: int = 0


@contextlib.contextmanager
def body_reads_host_count(handle: FaultHandle, use, count: HostCount | None = None) -> Iterator[None]:
    """Plant a token body that reads the batch's real token count (a Python int) and hands it to
    `use(hidden, count)`; the planted per-token inputs record the count for every step in `count`
    (a new one when None)."""
    count = HostCount() if count is None else count

    def make_inputs(token_inputs):
        def planted(metadata, input_ids, num_tokens):
            handle.fire()  # here, outside the compiled region: a counter inside it would be guarded
            count.value = metadata.num_actual_tokens
            return token_inputs(metadata, input_ids, num_tokens)
        return planted

    def make_body(make_token_body):
        def planted(model, *args, **kwargs):  # the decode kernel and rope_kv_write, as given
            body = make_token_body(model, *args, **kwargs)

            def reads_count(*args):
                return use(body(*args), count)

            return piecewise_model.own_code(reads_count)
        return planted

    with replace_function(piecewise_model, "token_inputs", make_inputs), \
            replace_function(piecewise_model, "make_token_body", make_body):
        yield


def guard_on_host_count(handle: FaultHandle):
    # Dynamo guards on the int it read: a batch with another count fails the guard and recompiles.
    return body_reads_host_count(handle, lambda hidden, count: hidden + 0 * count.value)


def scalar_frozen_at_compile(handle: FaultHandle):
    # Read through a function dynamo takes as constant: the count of the compile (a warmup batch of
    # padding only: 0) is baked into the graph without a guard, and masks every row after it.
    # The function takes no argument and reads the count it closes over: dynamo before 2.13 turns
    # each argument of such a function into a Python constant and fails (InternalTorchDynamoError)
    # on an object such as the count's holder.
    count = HostCount()

    @torch_internals.lazy_module("dynamo").assume_constant_result
    def real_tokens() -> int:
        return count.value

    def mask_padding(hidden, _count):
        keep = torch.arange(hidden.shape[0], device=hidden.device) < real_tokens()
        return hidden * keep[:, None].to(hidden.dtype)

    return body_reads_host_count(handle, mask_padding, count)


@contextlib.contextmanager
def piece_outputs_share_buffers(handle: FaultHandle) -> Iterator[None]:
    """Every piece's outputs copied into buffers shared across pieces by shape and dtype, as an output
    planner that pooled pieces' outputs would: q and the attention output, k and v, one layer's and
    the next's, share memory."""
    arena: dict[tuple[Any, ...], torch.Tensor] = {}

    def make(place_outputs):
        def planted(outputs):
            placed = []
            for out in place_outputs(outputs):
                if isinstance(out, torch.Tensor):
                    handle.fire()
                    key = (tuple(out.shape), out.dtype, out.device)
                    if key not in arena:
                        arena[key] = torch.empty_like(out)
                    out = arena[key].copy_(out)
                placed.append(out)
            return placed
        return planted

    with replace_function(compiled_piece, "place_outputs", make):
        yield


@contextlib.contextmanager
def warmup_runs_eager_ops(handle: FaultHandle) -> Iterator[None]:
    """The decode warmup forward runs the model's eager ops while the capture runs the compiled step:
    no shape is compiled before its capture (vLLM capturing a size that was never compiled)."""
    def make(warmup_step):
        def planted(self):
            handle.fire()
            host = self.host
            return host.model(host.input_ids, host.metadata, host.kv_cache)
        return planted

    with replace_method(DecoderGraphs, "warmup_step", make):
        yield


@contextlib.contextmanager
def reduce_overhead_pieces(handle: FaultHandle) -> Iterator[None]:
    """Pieces compiled as mode="reduce-overhead" compiles them: with inductor's cudagraph trees."""
    def make(inductor_options):
        def planted(**options):
            handle.fire()
            return {**inductor_options(**options), compiled_piece.CUDAGRAPHS_OPTION: True}
        return planted

    with replace_function(compiled_piece, "inductor_options", make):
        yield


COMPILED_FAULTS = (
    Fault(
        name="compiled-guard-fails-while-serving",
        bug_class="the compiled region reads a host count (a Python int) that changes per batch: "
                  "dynamo's guard fails at replay and recompiles, and the new graph runs outside "
                  "every captured piece",
        link="https://github.com/pytorch/pytorch/issues/132849",
        detector=DETECT_PREFILL,
        expected=r"prefill ran outside its graphs: .*piecewise recompile while serving",
        plant=guard_on_host_count,
    ),
    Fault(
        name="compiled-scalar-frozen-at-compile",
        bug_class="a Python scalar (the real token count) specialised at compile time without a "
                  "guard and frozen in the compiled graph",
        link="https://github.com/pytorch/pytorch/issues/132849",
        detector=DETECT_PREFILL,
        expected=DIVERGED,
        plant=scalar_frozen_at_compile,
    ),
    Fault(
        name="compiled-piece-outputs-share-buffers",
        bug_class="a compiled piece's output buffer reused by a memory planner shared across pieces: "
                  "one piece's output is overwritten before its reader runs",
        link="https://github.com/vllm-project/vllm/pull/9724",
        detector=DETECT_DECODE,
        expected=DIVERGED,
        plant=piece_outputs_share_buffers,
    ),
    Fault(
        name="compiled-recompiled-inside-capture",
        bug_class="a compiled region compiled (recompiled) inside a graph capture: the warmup ran "
                  "another path, so the first compile of a captured shape is recorded",
        link="https://github.com/sgl-project/sglang/pull/23428",
        detector=DETECT_DECODE,
        expected=r"dynamo would compile it inside a graph capture",
        plant=warmup_runs_eager_ops,
    ),
    Fault(
        name="reduce-overhead-inside-harness-graphs",
        bug_class="inductor's cudagraph trees (mode='reduce-overhead') nested inside the runtime's "
                  "own graphs",
        link="https://github.com/pytorch/pytorch/issues/120733",
        detector=DETECT_DECODE,
        expected=r"cudagraph trees \(triton\.cudagraphs, mode='reduce-overhead'\) inside the harness's",
        plant=reduce_overhead_pieces,
    ),
)
