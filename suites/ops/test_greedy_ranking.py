"""harness::greedy_pack and `rank_and_pack`: the greedy ranking as one op against the torch path
(`rank_logits` at width 1, then `pack_ranked`), and how an engine chooses it
(EngineConfig.greedy_ranking).

The Triton kernels run two ways: under Triton's interpreter on CPU tensors (TRITON_INTERPRET=1,
where triton is importable) and on CUDA (marker gpu), graphs included. The rest needs neither.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from harness.ops.greedy_ranking import greedy_pack, greedy_pack_op, rank_and_pack
from harness.ops.greedy_ranking_choice import choose_greedy_ranking
from harness.ranking import pack_ranking, rank_logits
from harness.runtime import Engine, EngineConfig
from suites.ops.test_decode_attention import OpNames
from suites.ops.triton_marks import needs_compiled_triton, needs_interpreter, needs_triton

NEG_INF, INF, NAN = float("-inf"), float("inf"), float("nan")


def logits_case(name: str, device: str = "cpu", vocab: int = 9000) -> torch.Tensor:
    """Rows that probe what the ranking must get exactly: ties within and across the kernels'
    4096-entry chunks, signed zeros, NaN, infinities, a chunk of -inf only."""
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    x = torch.randn(3, vocab, generator=g)
    if name == "ties-across-chunks":
        x[:, [4500, 100, vocab - 1]] = 9.0  # the lowest id wins, whichever chunk it is in
        x[1, 100] = 8.0
    elif name == "signed-zeros":
        x = -1 - torch.rand(3, vocab, generator=g)
        x[0, 7], x[0, 3] = -0.0, 0.0
        x[1, 3], x[1, 7] = -0.0, 0.0  # -0.0 equals +0.0: the lower id
        x[2, 5000] = -0.0
    elif name == "nan":
        x[0, 4097] = NAN
    elif name == "infinities":
        x[0, 10] = INF
        x[1] = NEG_INF
        x[2, :4096] = NEG_INF
    elif name == "bf16":
        return x.bfloat16().to(device)
    return x.to(device)


CASES = ("random", "ties-across-chunks", "signed-zeros", "nan", "infinities", "bf16")


def torch_path(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    packed = pack_ranking(rank_logits(logits, 1), logits.shape[0], 1)
    return packed.values, packed.tokens


def assert_matches_torch_path(got: tuple[torch.Tensor, torch.Tensor], logits: torch.Tensor) -> None:
    """Tokens and scales exactly (NaN where the torch path has NaN), logprobs to fp32 rounding."""
    values, tokens = (t.cpu() for t in got)
    want_values, want_tokens = (t.cpu() for t in torch_path(logits))
    assert tokens.dtype == torch.int64 and values.dtype == torch.float32
    assert torch.equal(tokens, want_tokens), f"tokens {tokens.tolist()}, torch path {want_tokens.tolist()}"
    assert torch.equal(values[:, 0], want_values[:, 0]), "the packed token ids differ"
    assert torch.equal(values[:, 2].nan_to_num(7.0), want_values[:, 2].nan_to_num(7.0)), \
        "the logit scales differ"
    torch.testing.assert_close(values[:, 1], want_values[:, 1], rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("name", CASES)
def test_torch_implementation_is_the_torch_path_bit_for_bit(name: str) -> None:
    logits = logits_case(name)
    values, tokens = greedy_pack(logits)
    want_values, want_tokens = torch_path(logits)
    assert torch.equal(tokens, want_tokens)
    assert torch.equal(values.nan_to_num(7.0), want_values.nan_to_num(7.0))


def test_rank_and_pack_takes_the_op_only_where_fused_and_greedy() -> None:
    logits = logits_case("random")
    for mode, width, expected in (("fused", 1, ["harness.greedy_pack.default"]), ("separate", 1, []),
                                  ("fused", 3, [])):
        with OpNames() as seen:
            packed = rank_and_pack(logits, 2, width, mode=mode)
        assert seen.names == expected, (mode, width, seen.names)
        want = pack_ranking(rank_logits(logits, width), 2, width)
        assert torch.equal(packed.values, want.values) and torch.equal(packed.tokens, want.tokens)
        assert packed.values.shape == (2, 2 * width + 1)


def test_the_op_refuses_what_it_cannot_pack() -> None:
    with pytest.raises(ValueError, match=r"logits must be \[rows, vocab\], got \(9000,\)"):
        greedy_pack(torch.zeros(9000))
    with pytest.raises(ValueError, match="2 ranked rows for 3 sequences"):
        rank_and_pack(torch.zeros(2, 10), 3, 1, mode="fused")


def test_dynamo_traces_the_op_whole() -> None:
    logits = logits_case("random")
    compiled = torch.compile(lambda x: greedy_pack_op(x, False)[0].sum(), backend="eager",
                             fullgraph=True)
    assert torch.equal(compiled(logits), greedy_pack(logits)[0].sum())


def test_engine_chooses_the_ranking_for_its_device() -> None:
    from harness.model import ReferenceLlama, tiny_llama

    model = ReferenceLlama.from_hf(tiny_llama(seed=0))
    base = EngineConfig(max_batch_size=2, max_num_tokens=32, block_size=16, max_model_len=64)
    assert Engine(model, base).greedy_ranking.mode == "separate"  # a CPU: the torch ops
    fused = Engine(model, replace(base, greedy_ranking="fused"))
    assert fused.greedy_ranking.mode == "fused" and not fused.stats.fallbacks
    logits = logits_case("random", vocab=model.vocab_size)
    with OpNames() as seen:
        fused.rank_and_pack(logits, 2, 1)
    assert seen.names == ["harness.greedy_pack.default"]
    with pytest.raises(ValueError, match=r"greedy_ranking must be one of \['separate', 'fused'\]"):
        EngineConfig(greedy_ranking="triton")
    assert choose_greedy_ranking(None, "cpu").reason.startswith("the device is cpu")


@needs_triton
@needs_interpreter
@pytest.mark.parametrize("name", CASES)
def test_interpreted_kernels_match_the_torch_path(name: str) -> None:
    from harness.ops.triton_greedy import greedy_pack_triton

    logits = logits_case(name)
    assert_matches_torch_path(greedy_pack_triton(logits), logits)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_triton
@needs_compiled_triton
@needs_cuda
@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("vocab", [9000, 128256])
def test_cuda_kernels_match_the_torch_path(name: str, vocab: int) -> None:
    logits = logits_case(name, "cuda", vocab)
    assert_matches_torch_path(greedy_pack(logits), logits)


@pytest.mark.gpu
@needs_triton
@needs_compiled_triton
@needs_cuda
@pytest.mark.parametrize("pdl", [False, True])
def test_cuda_graph_of_the_op_ranks_a_later_batch(pdl: bool) -> None:
    from harness.ops.pdl_support import pdl_missing

    if pdl and (pdl_missing() is not None or torch.cuda.get_device_capability() < (9, 0)):
        pytest.skip(f"PDL cannot run here: {pdl_missing() or 'compute capability below 9.0'}")
    logits = logits_case("random", "cuda", 128256).repeat(22, 1)[:64].bfloat16()
    later = logits_case("ties-across-chunks", "cuda", 128256).repeat(22, 1)[:64].bfloat16()
    greedy_pack(logits, pdl)  # warm, as a runtime does before its capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = greedy_pack(logits, pdl)
    logits.copy_(later)
    graph.replay()
    torch.cuda.synchronize()
    assert_matches_torch_path(out, later)
