"""The runner's own suite: graphs agree with eager, the ladder shares one pool, padding rows
never touch real KV, and two planted capture bugs are caught."""

from __future__ import annotations

import torch

from conftest import PROMPTS
from model_runner import ModelRunner
from planted import RebindsInputs, RegrowsWorkspace


def test_decode_graphs_agree_with_eager(eager_tokens):
    runner = ModelRunner()
    assert runner.generate(PROMPTS, 6) == eager_tokens
    assert runner.replays, "no decode step replayed a graph"


def test_the_ladder_is_captured_largest_first_into_one_pool():
    runner = ModelRunner()
    assert runner.capture_order == sorted(runner.graph_bs, reverse=True)
    assert all(graph.pool() == runner.graph_pool for graph in runner.graphs.values())


@torch.inference_mode()
def test_a_padded_batch_replays_as_eager():
    graphed, eager = ModelRunner(), ModelRunner(enforce_eager=True)
    graphed.model.k_cache.zero_()
    seqs, positions = [[0], [8], [16]], [0, 0, 0]  # three sequences, padded to the graph of 4
    ids = torch.tensor([3, 4, 5], device="cuda")
    results = []
    for runner in (graphed, eager):
        pos = runner.prepare(seqs, positions)
        results.append(runner.run_model(ids, pos, is_prefill=False))
    torch.testing.assert_close(results[0], results[1])
    assert graphed.replays == {4: 1}
    # Only the three real rows' slots were written; the padding row wrote to the sink slot.
    sink = graphed.model.k_cache.size(1) - 1
    written = graphed.model.k_cache[:, :sink].abs().sum(dim=(0, 2, 3)).nonzero().flatten().tolist()
    assert written == [0, 32, 64]


def _caught(runner_class, eager_tokens, prompts=PROMPTS) -> bool:
    """A planted bug is caught when the run raises a named error (the harness's emulated or
    sanitized graphs) or its tokens differ from eager (real graphs replaying stale memory)."""
    runner = runner_class()
    try:
        return runner.generate(prompts, 6) != eager_tokens
    except RuntimeError as error:
        # A GPU replaying into memory it no longer owns corrupts its new owner, and a kernel
        # indexing with what it finds there trips a device-side assert (which ends the process's
        # use of the GPU: such a test runs last).
        return "freed" in str(error) or "graph" in str(error).lower() or "device-side assert" in str(error)


def test_a_rebound_static_input_is_caught(eager_tokens):
    assert _caught(RebindsInputs, eager_tokens)


def test_a_workspace_regrown_after_capture_is_caught():
    # Twelve sequences (above max_bs: the first steps run eagerly) of lengths 1 to 12: the short
    # ones finish first, and the rest decode through the graphs.
    many = [list(range(1, n + 1)) for n in range(1, 13)]
    eager = ModelRunner(enforce_eager=True).generate(many, 6)
    assert ModelRunner().generate(many, 6) == eager
    runner = RegrowsWorkspace()
    try:
        tokens = runner.generate(many, 6)
    except RuntimeError as error:  # the harness's emulated or sanitized graphs name the freed memory
        assert "freed" in str(error) or "device-side assert" in str(error), error
        return
    assert tokens != eager or runner.freed_memory_written()
