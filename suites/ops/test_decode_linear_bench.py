"""scripts/decode_linear_bench.py without a GPU: the candidates it would time for each 1B shape,
and its refusal to time without CUDA (its correctness checks run with --dry-run under Triton's
interpreter, too slow for this suite)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from harness.ops.gemv_configs import choose_gemv_config

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "decode_linear_bench.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("decode_linear_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    # Its dataclasses look their module up in sys.modules while the class is made.
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


@pytest.mark.parametrize("m", [1, 8])
def test_candidates_start_with_the_heuristic_and_stay_valid(bench, m: int) -> None:
    for shape in bench.SHAPES:
        gated = shape.op == "norm_gemv_silu_mul"
        configs = bench.candidates(shape, m, 132, quick=False)
        assert configs[0] == choose_gemv_config(m, shape.n, shape.k, sms=132,
                                                rows_per_output=2 if gated else 1,
                                                tensor_cores=True)  # the bench's bf16
        assert len(set(configs)) == len(configs) and 2 <= len(configs) <= bench.MAX_CANDIDATES
        assert not gated or all(c.split_k == 1 for c in configs), "the gated kernel cannot split"
        assert bench.candidates(shape, m, 132, quick=True) == configs[:1]


def test_bytes_counted_are_the_weights_and_the_activations(bench) -> None:
    down = next(s for s in bench.SHAPES if s.name.startswith("down"))
    assert down.bytes_moved(1) == 2 * (2048 * 8192 + 8192 + 2048 + 2048)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_without_cuda_it_refuses_to_time(bench, capsys) -> None:
    assert bench.main([]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
