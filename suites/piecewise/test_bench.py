"""`harness bench piecewise` runs end to end (its own check: piecewise logits agree with eager) and
records where its numbers came from. Speed itself is never asserted in a test."""

from __future__ import annotations

from harness.bench import piecewise


def test_bench_prints_a_ratio_per_prompt_and_appends_it(tmp_path, capsys):
    output = tmp_path / "benchmarks.md"
    assert piecewise.main(["--iters", "1", "--warmup", "0", "--prompt", "16", "--prompt", "32",
                           "--device", "cpu", "--output", str(output)]) == 0
    printed = capsys.readouterr().out
    assert "| 16 |" in printed and "| 32 |" in printed
    written = output.read_text()
    assert written.count("## harness bench piecewise") == 1 and "commit: " in written


def test_the_bench_times_replayed_pieces_and_refuses_a_run_that_fell_back():
    import pytest
    import torch

    engine = piecewise.build_engine("tiny", torch.device("cpu"), (16,))
    timing = piecewise.measure(engine, 16, iters=1, warmup=0)  # captured at build: no fallback
    assert timing.piecewise_ms > 0
    engine.piecewise.clear()  # the pieces are gone: serving them now runs them eagerly
    with pytest.raises(RuntimeError, match="16 tokens: the piecewise run fell back: .*no graph"):
        piecewise.measure(engine, 16, iters=1, warmup=0)
