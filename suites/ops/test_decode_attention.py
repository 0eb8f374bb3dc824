"""harness::paged_decode_attention without triton: which kernel serves decode batches and why, the
dispatch of paged_attention() to it, its torch-ops implementation (CPU and the emulated device,
graphs included), and on CUDA (gpu) the engine's generations with the kernel against without."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.ops import AttentionMetadata, choose_decode_kernel, paged_attention
from harness.ops.decode_kernel import triton_import_error
from harness.runtime import Engine, EngineConfig
from suites.ops.batches import Batch
from suites.ops.decode_cases import decode_batch, replay_on_a_later_batch, torch_ops_output
from suites.ops.triton_marks import ENGINE_PICKS_TRITON_ON_A_GPU, on_a_real_gpu_only
from fixtures.emulated_device import on_the_emulated_device

SCALE = 0.35
DECODES = dict(lengths=[(7, 1), (21, 1), (2, 1)], heads=6, kv_heads=2, pad_tokens=1, pad_seqs=1)
MIXED = dict(lengths=[(5, 5), (9, 1)], heads=4, kv_heads=2)


class OpNames(TorchDispatchMode):
    """The names of the harness's ops dispatched while it is on."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func).startswith("harness."):
            self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def as_triton(batch: Batch) -> AttentionMetadata:
    """The batch's metadata rebuilt with decode_kernel="triton" (same sizes, same batch)."""
    md = batch.metadata
    twin = AttentionMetadata(md.max_batch_size, md.max_num_tokens, md.max_blocks_per_seq,
                             md.block_size, md.pad_slot, md.device, decode_kernel="triton")
    twin.prepare(batch.spans, num_tokens=md.max_num_tokens, num_seqs=md.max_batch_size)
    return twin


def attend(batch: Batch, metadata: AttentionMetadata) -> tuple[torch.Tensor, list[str]]:
    out = torch.full_like(batch.q, 7.0)
    with OpNames() as seen:
        paged_attention(batch.q, batch.k, batch.v, batch.cache.layer(0), metadata, SCALE, out)
    return out, seen.names


def test_a_decode_only_batch_runs_the_decode_op_and_matches_the_torch_ops_path() -> None:
    batch = decode_batch(**DECODES)
    expected = torch_ops_output(batch, SCALE)
    out, names = attend(batch, as_triton(batch))
    assert names == ["harness.paged_decode_attention.default"]
    assert torch.equal(out, expected)  # on the CPU the op runs the very same torch ops


@pytest.mark.parametrize("lengths,kernel", [(MIXED, "triton"), (DECODES, "torch")],
                         ids=["with-a-prefill", "torch-asked"])
def test_other_batches_keep_the_gather_path(lengths, kernel: str) -> None:
    batch = decode_batch(**lengths)
    metadata = as_triton(batch) if kernel == "triton" else batch.metadata
    assert not metadata.uses_decode_kernel
    _, names = attend(batch, metadata)
    assert names == ["harness.paged_attention.default"]


def test_metadata_refuses_an_unknown_decode_kernel() -> None:
    with pytest.raises(ValueError, match=r"decode_kernel must be one of \['torch', 'triton'\], got 'cuda'"):
        AttentionMetadata(2, 4, 2, 4, 8, decode_kernel="cuda")


def test_auto_chooses_torch_off_cuda_and_says_why() -> None:
    choice = choose_decode_kernel(None, "cpu")
    assert (choice.kernel, choice.fell_back) == ("torch", False)
    assert "the device is cpu" in choice.reason


def test_triton_asked_where_it_cannot_run_is_refused() -> None:
    with pytest.raises(ValueError, match=r"decode_kernel='triton' cannot run here: the device is cpu"):
        choose_decode_kernel("triton", "cpu")


def test_auto_on_the_emulated_device_is_torch() -> None:
    with on_the_emulated_device():
        choice = choose_decode_kernel(None, "cuda")
    assert choice.kernel == "torch" and "emulated CUDA device" in choice.reason
    assert not choice.fell_back


def test_explicit_torch_is_kept_whatever_the_device() -> None:
    assert choose_decode_kernel("torch", "cuda").kernel == "torch"


def test_engine_config_refuses_an_unknown_decode_kernel() -> None:
    with pytest.raises(ValueError, match=r"EngineConfig.decode_kernel must be one of"):
        EngineConfig(decode_kernel="flash")


def test_the_decode_kernel_round_trips_through_a_reproduction_file() -> None:
    config = EngineConfig(decode_kernel="torch")
    assert EngineConfig.from_dict(config.to_dict()) == config


def test_the_engine_reports_its_choice(reference_llama) -> None:
    engine = Engine(reference_llama, EngineConfig(max_batch_size=2, max_num_tokens=32, max_model_len=64))
    assert engine.decode_kernel.kernel == engine.metadata.decode_kernel
    assert engine.decode_kernel.kernel == ("triton" if reference_llama.device.type == "cuda"
                                           and triton_import_error() is None else "torch")


def test_the_emulated_device_captures_and_replays_the_decode_op() -> None:
    """Under emulate_cuda() "cuda" tensors are CPU tensors and the op's torch-ops implementation
    runs; a graph captured on one batch replays another of the same shape as eager runs it."""
    # Other lengths in as many blocks (a cache and metadata of the same shape), other values.
    later_lengths = dict(DECODES, lengths=[(8, 1), (24, 1), (3, 1)], seed=3)
    with on_the_emulated_device():
        first = decode_batch(**DECODES, device="cuda")
        later = decode_batch(**later_lengths, device="cuda")
        expected = torch_ops_output(later, SCALE)
        out = replay_on_a_later_batch(first, later, as_triton(first), SCALE)
        assert torch.equal(out.cpu(), expected.cpu())


@on_a_real_gpu_only(ENGINE_PICKS_TRITON_ON_A_GPU)
@pytest.mark.gpu
@pytest.mark.skipif(triton_import_error() is not None, reason="triton is not importable")
@pytest.mark.parametrize("compile_mode", ["none", "inductor"])
def test_cuda_engine_generations_with_the_kernel_match_the_torch_path(compile_mode: str) -> None:
    """The tiny model on CUDA, decode graphs and eager steps: the Triton decode kernel's
    generations against the gather path's, within compare_generations' tolerance."""
    from fixtures.models import TINY_ENGINE_CONFIG, mixed_requests
    from harness.check import compare_generations
    from harness.model import ReferenceLlama, tiny_llama

    model = ReferenceLlama.from_hf(tiny_llama(seed=0, device="cuda"))
    requests = mixed_requests(seed=2)
    config = replace(TINY_ENGINE_CONFIG, decode_graph_sizes=(1, 2, 4), compile=compile_mode)
    baseline = Engine(model, replace(config, decode_kernel="torch")).generate(requests)
    engine = Engine(model, replace(config, decode_kernel="triton"))
    candidate = engine.generate(requests)
    # Batches above the largest graph run eager and are counted; none may leave the kernel.
    kernel_fallbacks = [r for r in engine.stats.fallbacks if r.startswith("decode kernel")]
    assert engine.decode_kernel.kernel == "triton" and not kernel_fallbacks, engine.stats.fallbacks
    comparison = compare_generations(baseline, candidate)
    assert comparison.ok, str(comparison)
