"""A replay queued on a stream (the adversarial schedule, or behind `torch.cuda._sleep`) runs later
than it is issued. A storage regrown with `UntypedStorage.resize_()` meanwhile: CUDA copies it on
the current stream, after that stream's queued work, so a replay queued on the same stream reads
the old block first, correctly. From another stream it is a race (the replay reads a block freed
under it), and the emulated device refuses the replay when it runs: it writes through raw pointers,
and a write into memory the host freed corrupted the host's heap ("corrupted double-linked list",
the process aborted). Found running suites/public_bugs/test_workspace_held_elsewhere_regrown.py
under `--cuda-schedule adversarial`."""

from __future__ import annotations

import torch

from suites.cuda_device._own_process import in_a_process_of_its_own


def _regrow_under_a_queued_replay(replay_stream: str) -> tuple[str, list[float]]:
    import harness

    with harness.emulate_cuda(device="cpu", schedule="adversarial", races="off"):
        workspace = torch.zeros(8, device="cuda")
        x, out = torch.ones(8, device="cuda"), torch.zeros(8, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            workspace.copy_(x * 2)
            out.copy_(workspace + 1)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        on = side if replay_stream == "another stream" else torch.cuda.current_stream()
        with torch.cuda.stream(on):
            graph.replay()  # queued: runs when something waits for it
        workspace.untyped_storage().resize_(4096 * workspace.element_size())
        try:
            torch.cuda.synchronize()
            outcome = "ran"
        except Exception as error:  # noqa: BLE001 (the error the queued replay's run raised)
            outcome = f"{type(error).__name__}: {error}"
        return outcome, out.tolist()


def test_a_queued_replay_on_the_resizing_stream_runs_before_the_resize(outside_emulation):
    outcome, out = in_a_process_of_its_own(__file__, "_regrow_under_a_queued_replay", "the same stream")
    assert (outcome, out) == ("ran", [3.0] * 8)


def test_a_queued_replay_on_another_stream_is_refused_when_it_runs(outside_emulation):
    outcome, out = in_a_process_of_its_own(__file__, "_regrow_under_a_queued_replay", "another stream")
    assert outcome.startswith("FreedMemoryError: replay() of a graph whose memory moved"), outcome
    assert out == [0.0] * 8  # refused before its first write; and the process goes on


def test_a_queued_replay_of_a_graph_reset_meanwhile_runs_what_was_launched(outside_emulation):
    """CUDA finishes a launch of a graph destroyed after it; the memory check of a queued step
    must not take the reset for lost memory."""
    import harness

    with harness.emulate_cuda(device="cpu", schedule="adversarial", races="off"):
        x, out = torch.ones(8, device="cuda"), torch.zeros(8, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out.copy_(x * 3)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            graph.replay()
        graph.reset()
        torch.cuda.synchronize()
        assert out.tolist() == [3.0] * 8
