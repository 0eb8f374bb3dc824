"""The Triton decode GEMV kernels against the ops' torch implementation and float64.

Two ways to run them: under Triton's interpreter on CPU tensors (TRITON_INTERPRET=1, where triton
is importable: the CPU tests, small shapes), and on CUDA (marker gpu, without the interpreter):
the 1B shapes, graphs and the engine included. Where neither holds (CI's CPU wheel has no triton)
every test here skips with its reason.
"""

from __future__ import annotations

import pytest
import torch

from harness.ops.gemv_configs import GemvConfig
from suites.ops.decode_linear_cases import (OPS, GemvCase, float64_result, gemv_case,
                                            replay_on_a_later_case, steps_off)
from suites.ops.test_decode_linear import LLAMA_1B
from suites.ops.triton_marks import (INTERPRETED, needs_a_real_gpu_for_model_shapes,
                                     needs_compiled_triton, needs_interpreter, needs_triton)

# Small shapes for the interpreter: ragged N and K (masks), several M, bias, a split of K.
INTERPRETED_CASES = {
    "m1": dict(m=1, n=40, k=96),
    "m3-bias": dict(m=3, n=24, k=80, bias=True),
    "m8": dict(m=8, n=16, k=64),
    "fp16": dict(m=2, n=16, k=64, dtype=torch.float16),
}
CONFIGS = {"heuristic": None, "wide": GemvConfig(block_n=16, block_k=32),
           "split3": GemvConfig(block_n=8, block_k=32, split_k=3),
           "mma": GemvConfig(block_n=16, block_k=32, mma=True),
           "mma-split3": GemvConfig(block_n=16, block_k=16, split_k=3, mma=True, num_stages=2)}
SPLITS = ("split3", "mma-split3")


def kernel(case: GemvCase, config: GemvConfig | None = None) -> torch.Tensor:
    from harness.ops.triton_gemv import gemv_triton

    options = dict(bias=case.bias, config=config)
    if case.op == "gemv_residual":
        return gemv_triton(case.x, case.weight, residual=case.residual, **options)
    return gemv_triton(case.x, case.weight, norm_weight=case.norm_weight, eps=1e-5,
                       gated=case.op == "norm_gemv_silu_mul", **options)


def steps_from_torch_path(op: str) -> int:
    """Triton's interpreter (3.8) casts fp32 to bf16 by truncation, not to nearest, at each of the
    norm's two roundings (three steps there) and the gated epilogue's four more (five); two on
    CUDA, where the sums' order and torch's own fused rms_norm are the differences."""
    if not INTERPRETED:
        return 2
    return 5 if op == "norm_gemv_silu_mul" else 3


def assert_matches_torch_path(case: GemvCase, config: GemvConfig | None = None) -> None:
    expected = case.run_op()  # on CPU tensors the op's torch implementation
    if case.x.is_cuda:
        from harness.ops import decode_linear

        torch_impl = {"norm_gemv": decode_linear._norm_gemv_torch,
                      "gemv_residual": decode_linear._gemv_residual_torch,
                      "norm_gemv_silu_mul": decode_linear._norm_gemv_silu_mul_torch}[case.op]
        expected = torch_impl(*case.args())
    got = kernel(case, config)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    off = steps_off(got, expected)
    assert off <= steps_from_torch_path(case.op), f"{off:.2f} BF16 steps from the torch path"
    assert steps_off(got, float64_result(case)) <= steps_from_torch_path(case.op) + 2, "off float64"
    # Deterministic: a second launch gives the same bits.
    assert torch.equal(kernel(case, config), got)


@needs_triton
@needs_interpreter
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("shape", list(INTERPRETED_CASES))
@pytest.mark.parametrize("op", OPS)
def test_interpreted_kernel_matches_the_torch_path(op: str, shape: str, config: str) -> None:
    if op == "norm_gemv_silu_mul" and config in SPLITS:
        pytest.skip("the gated kernel does not split K")
    assert_matches_torch_path(gemv_case(op, **INTERPRETED_CASES[shape]), CONFIGS[config])


@needs_triton
@needs_interpreter
def test_interpreted_gated_kernel_refuses_a_split() -> None:
    with pytest.raises(ValueError, match="does not split K"):
        kernel(gemv_case("norm_gemv_silu_mul"), CONFIGS["split3"])


@needs_triton
@needs_interpreter
def test_interpreted_tensor_core_kernel_refuses_what_it_cannot_hold() -> None:
    with pytest.raises(ValueError, match="takes bf16 or fp16 operands, got torch.float32"):
        kernel(gemv_case("norm_gemv", m=1, n=16, k=32, dtype=torch.float32), CONFIGS["mma"])
    with pytest.raises(ValueError, match="takes at most 16 rows of x, got 17"):
        kernel(gemv_case("norm_gemv", m=17, n=16, k=32), CONFIGS["mma"])


@needs_triton
@needs_compiled_triton
def test_tensor_core_kernel_streams_its_tiles_through_shared_memory() -> None:
    """What the config's `mma` is for, in the sm_90 PTX (no GPU needed): the products on tensor
    cores and W's tiles copied asynchronously, the pipeliner's stages ahead of the products."""
    from suites.ops.pdl_ptx import CASES, kernel_ptx

    ptx = kernel_ptx(next(c for c in CASES if c.name == "gate_up tensor cores"), pdl=False)
    assert "mma.sync" in ptx
    assert "cp.async" in ptx


def test_a_planted_wrong_gate_order_is_caught() -> None:
    """The check above on a kernel that reads up rows as gate rows (the layout bug it exists
    for): far outside its tolerance, on the torch implementation alone (no triton needed)."""
    case = gemv_case("norm_gemv_silu_mul", m=2)
    expected = case.run_op()
    n = case.weight.shape[0] // 2
    swapped = gemv_case("norm_gemv_silu_mul", m=2)
    swapped.weight.copy_(torch.cat([case.weight[n:], case.weight[:n]]))
    assert steps_off(swapped.run_op(), expected) > 3


CUDA_SHAPES = {name: dict(n=n, k=k) for name, (n, k, rows) in LLAMA_1B.items()
               if name != "lm_head"}
CUDA_SHAPES["lm_head"] = dict(n=128256, k=2048)


def cuda_ops(shape: str) -> list[str]:
    return {"qkv": ["norm_gemv"], "lm_head": ["norm_gemv"], "o_proj": ["gemv_residual"],
            "down": ["gemv_residual"], "gate_up": ["norm_gemv_silu_mul"]}[shape]


@needs_a_real_gpu_for_model_shapes
@pytest.mark.gpu
@needs_triton
@needs_compiled_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("m", [1, 4, 8])
@pytest.mark.parametrize("shape", list(CUDA_SHAPES))
def test_cuda_kernel_matches_the_torch_path_on_the_1b_shapes(shape: str, m: int) -> None:
    for op in cuda_ops(shape):
        assert_matches_torch_path(gemv_case(op, m=m, device="cuda", **CUDA_SHAPES[shape]))


@needs_a_real_gpu_for_model_shapes
@pytest.mark.gpu
@needs_triton
@needs_compiled_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("op", OPS)
def test_cuda_op_is_captured_and_replays_a_later_batch(op: str) -> None:
    """The op dispatches to the kernel on CUDA (split K included for gemv_residual at K = 8192);
    a CUDA graph of it replays another batch's values."""
    shape = dict(n=2048, k=8192) if op == "gemv_residual" else dict(n=512, k=2048)
    first = gemv_case(op, m=1, bias=True, device="cuda", seed=2, **shape)
    later = gemv_case(op, m=1, bias=True, device="cuda", seed=5, **shape)
    expected = float64_result(later)
    out = replay_on_a_later_case(first, later)
    assert steps_off(out, expected) <= 4


@pytest.mark.gpu
@needs_triton
@needs_compiled_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("compile_mode", ["none", "inductor"])
def test_cuda_engine_generations_with_the_kernels_match_the_separate_path(compile_mode: str) -> None:
    """The tiny model on CUDA, decode graphs and eager steps: the fused GEMVs' generations against
    the separate path's, within compare_generations' tolerance."""
    from dataclasses import replace

    from harness.emulation import emulation_active

    if emulation_active() == "cpu":
        pytest.skip("the engine picks the fused GEMVs on a real CUDA device only "
                    "(choose_decode_linear); on the emulated device it runs the torch path")

    from fixtures.models import TINY_ENGINE_CONFIG, mixed_requests
    from harness.check import compare_generations
    from harness.model import ReferenceLlama, tiny_llama
    from harness.runtime import Engine

    model = ReferenceLlama.from_hf(tiny_llama(seed=0, device="cuda"))
    requests = mixed_requests(seed=2)
    config = replace(TINY_ENGINE_CONFIG, decode_graph_sizes=(1, 2, 4), compile=compile_mode)
    baseline = Engine(model, replace(config, decode_linear="separate")).generate(requests)
    engine = Engine(model, replace(config, decode_linear=None))
    candidate = engine.generate(requests)
    linear_fallbacks = [r for r in engine.stats.fallbacks if "decode linear" in r]
    assert engine.decode_linear.mode == "fused" and not linear_fallbacks, engine.stats.fallbacks
    comparison = compare_generations(baseline, candidate)
    assert comparison.ok, str(comparison)


def pdl_kernel(case: GemvCase, config: GemvConfig | None, pdl: bool) -> torch.Tensor:
    from harness.ops.triton_gemv import gemv_triton

    options = dict(bias=case.bias, config=config, pdl=pdl)
    if case.op == "gemv_residual":
        return gemv_triton(case.x, case.weight, residual=case.residual, **options)
    return gemv_triton(case.x, case.weight, norm_weight=case.norm_weight, eps=1e-5,
                       gated=case.op == "norm_gemv_silu_mul", **options)


@needs_triton
@needs_interpreter
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("shape", ["m1", "m3-bias"])
@pytest.mark.parametrize("op", OPS)
def test_interpreted_pdl_variant_is_the_default_bit_for_bit(monkeypatch, op, shape, config) -> None:
    """USE_PDL peels the first K tile (its weights loaded before the wait): the same sums in the
    same order. The interpreter runs no inline PTX, so the two grid-dependency instructions
    become no-ops here; what is checked is the peeled loop."""
    if op == "norm_gemv_silu_mul" and config in SPLITS:
        pytest.skip("the gated kernel does not split K")
    from harness.ops import triton_gemv, triton_pdl

    monkeypatch.setattr(triton_pdl, "_gdc_wait", lambda *args, **kwargs: None)
    monkeypatch.setattr(triton_pdl, "_gdc_launch_dependents", lambda *args, **kwargs: None)
    monkeypatch.setattr(triton_gemv, "pdl_launch_options",
                        lambda pdl: {"USE_PDL": True} if pdl else {})
    case = gemv_case(op, **INTERPRETED_CASES[shape])
    assert torch.equal(pdl_kernel(case, CONFIGS[config], True),
                       pdl_kernel(case, CONFIGS[config], False))


@needs_triton
@needs_compiled_triton
@needs_a_real_gpu_for_model_shapes
@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_cuda_pdl_variant_is_the_default_bit_for_bit(op) -> None:
    from harness.ops.pdl_choice import pdl_blocker

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    blocker, _ = pdl_blocker(torch.device("cuda"))
    if blocker is not None:
        pytest.skip(blocker)
    case = gemv_case(op, m=1, n=3072, k=2048, device="cuda")
    assert torch.equal(pdl_kernel(case, None, True), pdl_kernel(case, None, False))
