"""A replay queued on a stream (the adversarial schedule, or behind `torch.cuda._sleep`) runs later
than it is issued. A storage regrown with `UntypedStorage.resize_()` meanwhile: CUDA copies it on
the current stream, after that stream's queued work, so a replay queued on the same stream reads
the old block first, correctly. From another stream it is a race (the replay reads a block freed
under it), and the emulated device refuses the replay when it runs: it writes through raw pointers,
and a write into memory the host freed corrupted the host's heap ("corrupted double-linked list",
the process aborted). Found running suites/public_bugs/test_workspace_held_elsewhere_regrown.py
under `--cuda-schedule adversarial`."""

from __future__ import annotations

import pytest
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


# A launch while an earlier launch of the graph (or an op reading the memory) still waits in a
# queue: the queued work keeps the caller's memory alive in the emulator (its raw pointers must stay
# valid), but on CUDA the caller's free gives the block back to the allocator at once, so the new
# launch replays into freed memory. The launch must be refused on every schedule, as it is when
# nothing is queued. Found running suites/public_bugs/test_workspace_shared_across_graph_pools.py
# under `--cuda-schedule adversarial` (the replay was never refused).

def _graph_reading(buf: torch.Tensor, out: torch.Tensor) -> torch.cuda.CUDAGraph:
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(buf * 2)
    return graph


def _queue_on_current_stream(schedule: str) -> None:
    """What makes the next work on the current stream wait in its queue on `schedule`."""
    if schedule == "issue_order":
        torch.cuda._sleep(1000)


@pytest.mark.parametrize("schedule", ["adversarial", "issue_order"])
def test_a_launch_after_the_caller_freed_memory_an_earlier_queued_launch_holds_is_refused(
        outside_emulation, schedule):
    import harness
    from harness.graphs import FreedMemoryError

    with harness.emulate_cuda(device="cpu", schedule=schedule, races="report"):
        buf, out = torch.ones(4, device="cuda"), torch.zeros(4, device="cuda")
        graph = _graph_reading(buf, out)
        _queue_on_current_stream(schedule)
        graph.replay()  # queued: keeps buf's memory valid until it runs
        del buf  # CUDA's allocator has the block back now
        with pytest.raises(FreedMemoryError, match="last reference was dropped since capture"):
            graph.replay()
        torch.cuda.synchronize()
        assert out.tolist() == [2.0] * 4  # the first launch still ran, on memory alive at launch


def test_a_launch_after_the_caller_freed_memory_a_queued_op_reads_is_refused(outside_emulation):
    import harness
    from harness.graphs import FreedMemoryError

    with harness.emulate_cuda(device="cpu", schedule="adversarial", races="report"):
        buf, out = torch.ones(4, device="cuda"), torch.zeros(4, device="cuda")
        graph = _graph_reading(buf, out)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            total = buf.sum()  # queued on the side stream, reading buf
        del buf
        with pytest.raises(FreedMemoryError, match="last reference was dropped since capture"):
            graph.replay()
        torch.cuda.synchronize()
        assert total.item() == 4.0


def test_a_launch_after_the_pool_owning_its_workspace_was_released_is_refused(outside_emulation):
    """TensorRT-LLM's shared workspace: allocated in graph A's capture (A's pool), used by B; A is
    evicted with its workspace and the pool released while B's launch is queued."""
    import harness
    from harness.graphs import FreedMemoryError

    with harness.emulate_cuda(device="cpu", schedule="adversarial", races="report"):
        x, out = torch.ones(4, device="cuda"), torch.zeros(4, device="cuda")
        torch.cuda.synchronize()
        first, second = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(first):
            workspace = torch.zeros(4, device="cuda")
            workspace.copy_(x)
        with torch.cuda.graph(second):
            workspace.mul_(3)
            out.copy_(workspace)
        second.replay()  # queued
        first.reset()
        del workspace
        torch.cuda.empty_cache()
        with pytest.raises(FreedMemoryError, match="another graph's private pool"):
            second.replay()


@pytest.mark.parametrize("schedule", ["adversarial", "issue_order"])
def test_memory_the_caller_keeps_or_frees_after_the_launch_replays_as_launched(outside_emulation,
                                                                               schedule):
    """Freeing after the launch is stream-ordered on CUDA (the block goes to work queued after the
    replay), and a buffer the caller still holds is no free at all: both replay."""
    import harness

    with harness.emulate_cuda(device="cpu", schedule=schedule, races="report"):
        kept, dropped = torch.ones(4, device="cuda"), torch.full((4,), 2.0, device="cuda")
        out = torch.zeros(4, device="cuda")
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out.copy_(kept + dropped)
        alias = kept.view(2, 2)
        del kept  # a view keeps the memory: no free
        _queue_on_current_stream(schedule)
        graph.replay()
        graph.replay()  # queued behind the first: both launched with every buffer alive
        del dropped
        torch.cuda.synchronize()
        assert out.tolist() == [3.0] * 4
        assert alias.sum().item() == 4.0
