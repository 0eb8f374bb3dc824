"""The decode GEMV ops without triton: their torch implementation (CPU and the emulated device,
graphs included) against float64, the model's fused mode against its separate mode, their trace by
dynamo as opaque calls, the launch-config heuristic, and how an engine chooses them
(EngineConfig.decode_linear)."""

from __future__ import annotations

import pytest
import torch
from torch import fx

from fixtures.emulated_device import on_the_emulated_device
from harness.ops import AttentionMetadata, SequenceSpan
from harness.ops.decode_linear import (gemv_residual, gemv_residual_op, norm_gemv, norm_gemv_op,
                                       norm_gemv_silu_mul, norm_gemv_silu_mul_op)
from harness.ops.decode_linear_choice import DECODE_LINEAR_MAX_TOKENS, choose_decode_linear
from harness.ops.gemv_configs import GemvConfig, choose_gemv_config
from harness.records import Request
from harness.runtime import Engine, EngineConfig
from suites.ops.decode_linear_cases import OPS, float64_result, gemv_case, steps_off
from suites.ops.test_decode_attention import OpNames

GEMV_OPS = {"harness.norm_gemv.default", "harness.gemv_residual.default",
            "harness.norm_gemv_silu_mul.default"}


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("op", OPS)
def test_torch_path_is_within_two_steps_of_float64(op: str, m: int, bias: bool) -> None:
    case = gemv_case(op, m=m, bias=bias, seed=m)
    got = case.run_op()
    assert got.shape == float64_result(case).shape and got.dtype == torch.bfloat16
    assert steps_off(got, float64_result(case)) <= 2


def engine_forward(model, mode: str, tokens: int) -> tuple[torch.Tensor, list[str]]:
    """Logits of one forward of `tokens` decode rows (two real sequences, the rest padding)
    through an engine of `mode`, and the harness ops it dispatched."""
    engine = Engine(model, EngineConfig(max_batch_size=16, max_num_tokens=32, max_model_len=64,
                                        decode_linear=mode))
    spans = [SequenceSpan(9, 1, engine.kv_cache.allocator.allocate(1)),
             SequenceSpan(4, 1, engine.kv_cache.allocator.allocate(1))]
    engine.kv_cache.tensor.copy_(torch.randn(engine.kv_cache.tensor.shape,
                                             generator=torch.Generator().manual_seed(1)))
    engine.metadata.prepare(spans, num_tokens=tokens, num_seqs=2)
    ids = torch.tensor([7, 11] + [0] * (tokens - 2))
    with OpNames() as seen:
        logits = model(ids, engine.metadata, engine.kv_cache)
    return logits, seen.names


def test_the_fused_model_is_the_separate_model_bit_for_bit_off_cuda(reference_llama) -> None:
    """Off CUDA the ops run the separate path's torch ops: the same logits, to the bit, from
    three ops per layer; the final norm + lm_head stay on the torch ops (cuBLAS wins there)."""
    expected, separate_ops = engine_forward(reference_llama, "separate", 4)
    got, fused_ops = engine_forward(reference_llama, "fused", 4)
    assert torch.equal(got, expected)
    layers = reference_llama.num_layers
    assert not GEMV_OPS & set(separate_ops)
    assert fused_ops.count("harness.norm_gemv.default") == layers  # qkv per layer, not lm_head
    assert fused_ops.count("harness.gemv_residual.default") == 2 * layers  # o_proj, down_proj
    assert fused_ops.count("harness.norm_gemv_silu_mul.default") == layers


def test_batches_above_the_limit_stay_on_torch_matmul(reference_llama) -> None:
    _, ops = engine_forward(reference_llama, "fused", DECODE_LINEAR_MAX_TOKENS + 1)
    assert not GEMV_OPS & set(ops), ops
    _, ops = engine_forward(reference_llama, "fused", DECODE_LINEAR_MAX_TOKENS)
    assert GEMV_OPS <= set(ops)


def test_the_wrappers_refuse_mismatched_shapes() -> None:
    case = gemv_case("norm_gemv", m=2)
    with pytest.raises(ValueError, match=r"norm_gemv: x must be \[tokens, K\]"):
        norm_gemv(case.x[:, :-1], case.norm_weight, 1e-5, case.weight)
    with pytest.raises(ValueError, match="norm_weight .* must be"):
        norm_gemv(case.x, case.norm_weight[:-1], 1e-5, case.weight)
    with pytest.raises(ValueError, match="residual"):
        gemv_residual(case.x, case.weight, None, case.residual[:1])
    with pytest.raises(ValueError, match="even number of rows"):
        norm_gemv_silu_mul(case.x, case.norm_weight, 1e-5, case.weight[:-1])
    with pytest.raises(ValueError, match="bias"):
        norm_gemv(case.x, case.norm_weight, 1e-5, case.weight, case.weight[0, :3])


def test_dynamo_keeps_each_op_one_opaque_call() -> None:
    """Traced whole (fullgraph) with the fakes: each op one node of the graph, nothing of its
    torch implementation inlined (no rms_norm, no addmm), and the compiled result the eager one."""
    cases = {op: gemv_case(op, m=2, seed=3) for op in OPS}
    graphs: list[fx.GraphModule] = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def step(a, b, c):
        return (norm_gemv_op(*a).sum() + gemv_residual_op(*b).sum()
                + norm_gemv_silu_mul_op(*c).sum())

    args = [cases[op].args() for op in OPS]
    got = torch.compile(step, backend=record, fullgraph=True, dynamic=False)(*args)
    assert torch.equal(got, step(*args))
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert [t for t in targets if t.startswith("harness.")] == [
        "harness.norm_gemv.default", "harness.gemv_residual.default",
        "harness.norm_gemv_silu_mul.default"]
    assert not [t for t in targets if "rms_norm" in t or "addmm" in t or "linear" in t], targets


@pytest.mark.parametrize("op", OPS)
def test_the_emulated_device_captures_and_replays_the_ops(op: str) -> None:
    """Capture on one case, copy another's values into the captured inputs, replay: the output
    is the eager op's on the second case."""
    from suites.ops.decode_linear_cases import replay_on_a_later_case

    with on_the_emulated_device():
        first = gemv_case(op, m=3, bias=True, device="cuda", seed=2)
        later = gemv_case(op, m=3, bias=True, device="cuda", seed=7)
        out = replay_on_a_later_case(first, later)
        assert torch.equal(out.cpu(), later.run_op().cpu())


def test_auto_chooses_separate_off_cuda_and_fused_is_kept_there() -> None:
    auto = choose_decode_linear(None, "cpu")
    assert (auto.mode, auto.fell_back) == ("separate", False) and "cpu" in auto.reason
    assert choose_decode_linear("fused", "cpu").mode == "fused"
    assert choose_decode_linear("separate", "cpu").mode == "separate"


def test_auto_on_the_emulated_device_is_separate_and_fused_runs_the_torch_ops() -> None:
    with on_the_emulated_device():
        auto = choose_decode_linear(None, "cuda")
        assert auto.mode == "separate" and "emulated CUDA device" in auto.reason
        assert choose_decode_linear("fused", "cuda").mode == "fused"


def test_unknown_modes_are_refused() -> None:
    with pytest.raises(ValueError, match=r"decode_linear must be one of \['separate', 'fused'\]"):
        choose_decode_linear("triton", "cpu")
    with pytest.raises(ValueError, match="EngineConfig.decode_linear"):
        EngineConfig(decode_linear="gemv")
    with pytest.raises(ValueError, match="decode_linear must be one of"):
        AttentionMetadata(1, 1, 1, 1, 1, decode_linear="yes")


def test_the_mode_round_trips_through_a_reproduction_file() -> None:
    config = EngineConfig(decode_linear="fused")
    assert EngineConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize("mode", ["fused", "separate"])
def test_the_engine_reports_its_choice_and_the_model_follows_it(reference_llama, mode) -> None:
    engine = Engine(reference_llama, EngineConfig(max_batch_size=2, max_num_tokens=32,
                                                  max_model_len=64, decode_linear=mode))
    assert engine.decode_linear.mode == engine.metadata.decode_linear == mode
    with OpNames() as seen:
        engine.generate([Request([3, 4, 5], 3)])
    assert bool(GEMV_OPS & set(seen.names)) == (mode == "fused")


# The 1B shapes of issue 28's profile at batch 1: (n, k, rows of W per output).
LLAMA_1B = {"qkv": (3072, 2048, 1), "o_proj": (2048, 2048, 1), "down": (2048, 8192, 1),
            "gate_up": (8192, 2048, 2), "lm_head": (128256, 2048, 1)}


@pytest.mark.parametrize("m", [1, 2, 8])
@pytest.mark.parametrize("shape", list(LLAMA_1B))
def test_the_config_keeps_the_device_busy_within_register_bounds(shape: str, m: int) -> None:
    n, k, rows = LLAMA_1B[shape]
    config = choose_gemv_config(m, n, k, sms=132, rows_per_output=rows)
    assert config == choose_gemv_config(m, n, k, sms=132, rows_per_output=rows)  # from shapes only
    programs = -(-n // config.block_n) * config.split_k
    assert programs >= 2 * 132 or config.block_n == 8, config
    assert config.block_n * config.block_k * m * rows <= 16384 * 2, config
    assert rows == 1 or config.split_k == 1, "the gated kernel cannot split K"
    assert k // config.split_k >= config.block_k


def test_down_proj_splits_k_and_lm_head_does_not() -> None:
    assert choose_gemv_config(1, 2048, 8192, sms=132).split_k > 1
    assert choose_gemv_config(1, 128256, 2048, sms=132).split_k == 1


def test_gate_up_takes_tensor_cores_only_where_they_can_run() -> None:
    gate_up = dict(sms=132, rows_per_output=2)
    assert choose_gemv_config(1, 8192, 2048, tensor_cores=True, **gate_up).mma
    assert choose_gemv_config(16, 8192, 2048, tensor_cores=True, **gate_up).mma
    # fp32 operands, more rows than one tile holds, an N narrower than its row block: row tiles.
    assert not choose_gemv_config(1, 8192, 2048, **gate_up).mma
    assert not choose_gemv_config(17, 8192, 2048, tensor_cores=True, **gate_up).mma
    assert not choose_gemv_config(1, 32, 2048, tensor_cores=True, **gate_up).mma
    # The other GEMVs measured faster on row tiles (docs/benchmarks.md).
    assert not choose_gemv_config(1, 2048, 8192, sms=132, tensor_cores=True).mma


def test_bad_configs_and_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="block_n must be a power of two"):
        GemvConfig(block_n=24, block_k=64)
    with pytest.raises(ValueError, match="split_k must be in"):
        GemvConfig(block_n=8, block_k=64, split_k=0)
    with pytest.raises(ValueError, match="num_stages must be in"):
        GemvConfig(block_n=8, block_k=64, num_stages=0)
    with pytest.raises(ValueError, match="tensor-core GemvConfig needs block_n and block_k >= 16, "
                                         "got 8 and 64"):
        GemvConfig(block_n=8, block_k=64, mma=True)
    with pytest.raises(ValueError, match="prefetch_k must be a multiple of 8 >= 0, on a "
                                         r"tensor-core config only, got 512 \(mma=False\)"):
        GemvConfig(block_n=8, block_k=64, prefetch_k=512)
    with pytest.raises(ValueError, match="got 12"):
        GemvConfig(block_n=16, block_k=64, mma=True, prefetch_k=12)
    with pytest.raises(ValueError, match="GEMV shapes must be >= 1"):
        choose_gemv_config(0, 8, 8)
