"""The Triton rope + KV-write kernel against the op's torch implementation and float64.

Two ways to run it: under Triton's interpreter on CPU tensors (TRITON_INTERPRET=1, where triton is
importable: the CPU test), and on CUDA (marker gpu, without the interpreter), graphs included. Where
neither holds (CI's CPU wheel has no triton) every test here skips with its reason.
"""

from __future__ import annotations


import pytest
import torch

from suites.ops.rope_kv_cases import (RopeKvCase, bf16_steps, float64_rotation, replay_on_a_later_case,
                                      rope_kv_case, separate_path)
from suites.ops.triton_marks import (ENGINE_PICKS_TRITON_ON_A_GPU, INTERPRETED,
                                     needs_compiled_triton, needs_interpreter, needs_triton,
                                     on_a_real_gpu_only)


SHAPES = {
    "gqa": dict(),
    "llama-1b-head": dict(heads=32, kv_heads=8, head_dim=64, block_size=16, num_blocks=8),
    "odd-heads-dim": dict(heads=3, kv_heads=1, head_dim=12, block_size=3, pad_rows=2),
    "fp16": dict(dtype=torch.float16, seed=4),
    "fp32": dict(dtype=torch.float32, seed=5),
}


def kernel_run(case: RopeKvCase) -> None:
    from harness.ops.triton_rope_kv import rope_kv_write_triton

    rope_kv_write_triton(*case.args())


def steps_from_torch_path(dtype: torch.dtype) -> int:
    """One step of the dtype on CUDA (the kernel may fuse the final multiply-add). Triton's
    interpreter (3.8) casts fp32 to bf16 by truncation, not to nearest (-9.1006 became -9.0625, 9.125
    in torch), and the rotation rounds twice: three steps there."""
    return 3 if INTERPRETED and dtype == torch.bfloat16 else 1


def assert_matches_torch_path(case: RopeKvCase) -> None:
    """q and the real rows' cache slots within `steps_from_torch_path` of the torch path, and within
    two steps more of float64 rope; v and every unmapped slot exactly. (The pad sink is left out:
    padded rows all write it, and which write lands last is the launch's business.)"""
    q0, k0 = case.q.clone(), case.k.clone()
    expected_q, expected_layer = separate_path(case)
    kernel_run(case)
    dtype = case.qkv.dtype
    steps = steps_from_torch_path(dtype)
    n = case.num_real
    slots = case.slot_mapping[:n]
    flat = case.cache.layer(0).flatten(1, 2)
    expected_flat = expected_layer.flatten(1, 2)
    for name, got, want in (("q", case.q[:n], expected_q[:n]),
                            ("cached k/v", flat[:, slots], expected_flat[:, slots])):
        limit = bf16_steps(dtype, want.abs().max().item(), steps)
        diff = (got.double() - want.double()).abs().max().item()
        assert diff <= limit, f"{name}: {diff:.3g} from the torch path > {limit:.3g}"
    assert torch.equal(flat[1][slots], case.v[:n]), "v is not stored as it came"
    written = torch.zeros(flat.shape[1], dtype=torch.bool, device=flat.device)
    written[case.slot_mapping] = True
    assert torch.equal(flat[:, ~written], expected_flat[:, ~written]), \
        "a slot outside the slot mapping changed"
    for name, got, x in (("q", case.q[:n], q0[:n]), ("k", flat[0][slots], k0[:n])):
        want = float64_rotation(x, case.cos[:n], case.sin[:n])
        limit = bf16_steps(dtype, want.abs().max().item(), steps + 2)
        assert (got.double().cpu() - want).abs().max().item() <= limit, f"{name} off float64 rope"
    assert torch.equal(case.k, k0), "k changed (the schema says only q and the cache are written)"


@needs_triton
@needs_interpreter
@pytest.mark.parametrize("shape", list(SHAPES))
def test_interpreted_kernel_matches_the_torch_path(shape: str) -> None:
    assert_matches_torch_path(rope_kv_case(**SHAPES[shape]))


@on_a_real_gpu_only("the tolerance is the GPU kernel's; the interpreter rounds bf16 otherwise, "
                    "and the interpreted rows check the kernel with their own")
@pytest.mark.gpu
@needs_triton
@needs_compiled_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("shape", list(SHAPES))
def test_cuda_kernel_matches_the_torch_path(shape: str) -> None:
    assert_matches_torch_path(rope_kv_case(**SHAPES[shape], device="cuda"))


@pytest.mark.gpu
@needs_triton
@needs_compiled_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_op_is_captured_and_replays_a_later_batch() -> None:
    """The op dispatches to the kernel on CUDA; a CUDA graph of it replays another batch's values
    (slots read on the device, nothing on the host)."""
    first, later = rope_kv_case(device="cuda", seed=2), rope_kv_case(device="cuda", seed=5)
    expected_q, expected_layer = separate_path(later)
    replay_on_a_later_case(first, later)
    n, slots = later.num_real, later.slot_mapping[: later.num_real]
    limit = bf16_steps(torch.bfloat16, expected_layer.abs().max().item(), 1)
    assert (first.q[:n].double() - expected_q[:n].double()).abs().max().item() <= limit
    got, want = first.cache.layer(0).flatten(1, 2), expected_layer.flatten(1, 2)
    assert (got[:, slots].double() - want[:, slots].double()).abs().max().item() <= limit


@on_a_real_gpu_only(ENGINE_PICKS_TRITON_ON_A_GPU)
@pytest.mark.gpu
@needs_triton
@needs_compiled_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("compile_mode", ["none", "inductor"])
def test_cuda_engine_generations_with_the_kernel_match_the_separate_path(compile_mode: str) -> None:
    """The tiny model on CUDA, decode graphs and eager steps, the Triton decode kernel in both:
    the fused op's generations against the separate path's, within compare_generations'
    tolerance."""
    from dataclasses import replace

    from fixtures.models import TINY_ENGINE_CONFIG, mixed_requests
    from harness.check import compare_generations
    from harness.model import ReferenceLlama, tiny_llama
    from harness.runtime import Engine

    model = ReferenceLlama.from_hf(tiny_llama(seed=0, device="cuda"))
    requests = mixed_requests(seed=2)
    config = replace(TINY_ENGINE_CONFIG, decode_graph_sizes=(1, 2, 4), compile=compile_mode,
                     decode_kernel="triton")
    baseline = Engine(model, replace(config, rope_kv_write="separate")).generate(requests)
    engine = Engine(model, replace(config, rope_kv_write=None))
    candidate = engine.generate(requests)
    # Batches above the largest graph run eager and are counted; none may leave the fused op.
    rope_fallbacks = [r for r in engine.stats.fallbacks if "rope" in r]
    assert engine.rope_kv_write.mode == "fused" and not rope_fallbacks, engine.stats.fallbacks
    comparison = compare_generations(baseline, candidate)
    assert comparison.ok, str(comparison)
