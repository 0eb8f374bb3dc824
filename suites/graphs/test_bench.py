"""`harness bench emulator` runs end to end (its own check: replay equals eager) and records where
its numbers came from. Speed itself is never asserted in a test."""

from __future__ import annotations

from harness.bench import emulator


def test_bench_prints_a_table_and_appends_it_with_its_provenance(tmp_path, capsys):
    output = tmp_path / "benchmarks.md"
    argv = ["--iters", "2", "--warmup", "1", "--case", "hand-written decode step",
            "--output", str(output), "--no-device", "--no-tracking", "--no-tracked-eager"]
    assert emulator.main(argv) == 0
    assert emulator.main(argv + ["--no-write"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("| hand-written decode step |") == 2
    written = output.read_text()
    assert written.count("## harness bench emulator") == 1
    assert "commit: " in written and "torch " in written
    assert "| hand-written decode step |" in written


def test_transformers_llama_decode_step_replays_equal_to_eager():
    # measure() raises unless the first replay equals eager bit for bit.
    timing = emulator.measure("transformers Llama decode step", batch=2, iters=1, warmup=0)
    assert timing.ops > 100


def test_the_last_line_names_each_miss_with_its_own_target():
    line = emulator.verdict([("Llama (adversarial eager)", 7.71, 5.0),
                             ("Llama (tracked eager)", 5.58, 2.0)])
    assert line == ("targets missed: Llama (adversarial eager) 7.71x > 5.00x; "
                    "Llama (tracked eager) 5.58x > 2.00x")
    assert emulator.verdict([]) == "every target met"
