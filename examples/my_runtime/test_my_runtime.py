"""The checks a runtime's own suite runs: eager against transformers' generate(), graphs against
eager, the capture lint of the decode step, and a planted bug that the comparison must catch."""

from __future__ import annotations

import pytest

from harness.check import capture_lint, compare_generations
from harness.graphs import FreedMemoryError
from harness.model.hf_generate import hf_greedy_generations
from my_runtime import MyRuntime


pytestmark = pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated")


def test_eager_agrees_with_transformers_generate(hf_model, eager_runtime, requests):
    comparison = compare_generations(hf_greedy_generations(hf_model, requests), eager_runtime.generate(requests))
    assert comparison.ok, str(comparison)


def test_graph_replay_agrees_with_eager(eager_runtime, graph_runtime, requests):
    eager, graphed = eager_runtime.generate(requests), graph_runtime.generate(requests)
    comparison = compare_generations(eager, graphed)
    assert comparison.ok, str(comparison)
    assert graphed[0].steps[1].producer == "decode[bs=1,greedy]"  # the comparison judged replays


def test_decode_step_has_no_capture_hazards(eager_runtime):
    # Lint the step as it is captured: after a warmup call, which does the lazy set-up (a static
    # cache moves its counters to the device on first use, a host copy a capture must not see).
    eager_runtime.decode_step()
    report = capture_lint(eager_runtime.decode_step, context=(eager_runtime,))
    assert report.clean, str(report)


class ForgetsToAdvance(MyRuntime):
    """Planted bug: the position buffer is rebound instead of copied into, so replays keep reading
    the captured one. The old buffers stay referenced (as a runtime that keeps them in a list would),
    so the graph reads live, stale positions on every backend."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.retired = []

    def set_inputs(self, token, position):
        self.retired.append(self.position)
        self.position = self.position.clone()
        super().set_inputs(token, position)


def test_comparison_catches_a_planted_bug(hf_model, graph_backend, eager_runtime, requests):
    broken = ForgetsToAdvance(hf_model, backend=graph_backend)
    comparison = compare_generations(eager_runtime.generate(requests), broken.generate(requests))
    assert not comparison.ok, "replays that read a stale position buffer agreed with eager"
    assert comparison.divergences[0].producer == "decode[bs=1,greedy]", str(comparison)


def test_a_rebound_buffer_that_is_freed_is_named_on_the_emulator(hf_model, graph_backend, requests):
    class RebindsAndFrees(MyRuntime):
        def set_inputs(self, token, position):
            self.position = self.position.clone()
            super().set_inputs(token, position)

    if graph_backend.name != "emulated":
        pytest.skip("on CUDA the replay reads the freed address; the emulator names the freed tensor")
    with pytest.raises(FreedMemoryError, match="freed after capture"):
        RebindsAndFrees(hf_model, backend=graph_backend).generate(requests)


def test_lint_from_the_command_line(capsys):
    from harness import cli

    assert cli.main(["lint", "--factory", "my_runtime:make_decode_step"]) == 0
    assert "clean" in capsys.readouterr().out
