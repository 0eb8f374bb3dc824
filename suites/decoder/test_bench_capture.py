"""`harness bench capture` reports each figure against its target (speed itself is never asserted)."""

from __future__ import annotations

from harness.bench import capture
from harness.bench.capture import CaptureTiming, ReplayTiming


def test_targets_missed_are_named_with_their_figures():
    captures = [CaptureTiming("tiny", two_pass_ms=100.0, single_pass_ms=80.0)]
    replays = [ReplayTiming("tiny", 1, eager_ms=3.0, replay_ms=0.3), ReplayTiming("1b", 1, 12.0, 1.5),
               ReplayTiming("1b", 64, 20.0, 10.0)]
    assert capture.misses(captures, replays) == ["tiny capture 0.80x > 0.7", "tiny replay at batch 1 10.0x < 15x"]
    table = capture.render("cuda", captures, replays, {"tiny": 0.0, "1b": 0.5}, iters=5)
    assert "| tiny | 100.0 | 80.0 | 0.80x |" in table and "| 1b | 1 | 12.000 | 1.500 | 8.0x | 0.500 |" in table
