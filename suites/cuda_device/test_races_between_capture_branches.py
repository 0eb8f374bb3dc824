"""Races between the branches of one capture: a stream forked into the capture runs beside the
capturing stream's later nodes until a join. The caching allocator reuses a block freed on the
capturing stream while a forked stream still reads it (no `record_stream`) for the capturing
stream's next allocation in the same capture, as PyTorch's allocator does; the next write and the
branch's read are then unordered nodes of the graph. Two branches writing one tensor unjoined race
too. A recorded stream, or a join before the drop, keeps them apart. Emulated device only: CUDA
records such a graph without a word, and the GPU's verdict is a corrupted value now and then."""

from __future__ import annotations

import pytest
import torch

from harness.emulation import track_stream_races
from harness.emulation.tracking import RaceError

N = 1 << 12


def _capture(body) -> torch.cuda.CUDAGraph:
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with track_stream_races():
        with torch.cuda.graph(graph):
            body()
    return graph


def _drop_under_a_branch(*, record: bool, join_first: bool) -> None:
    x = torch.arange(float(N), device="cuda")
    side = torch.cuda.Stream()

    def body() -> None:
        main = torch.cuda.current_stream()
        tmp = x * 2
        side.wait_stream(main)
        with torch.cuda.stream(side):
            tmp.sum()
        if record:
            tmp.record_stream(side)
        if join_first:
            main.wait_stream(side)
        del tmp
        x * 3  # the capturing stream's next allocation of that size
        main.wait_stream(side)

    _capture(body)


@pytest.mark.strict_races
def test_a_block_freed_under_a_forked_read_and_reused_is_a_race(cuda_device):
    with pytest.raises(RaceError, match=r"(?s)captured aten\.mul\.Tensor writes it.*"
                       r"captured aten\.sum\.default reads it"):
        _drop_under_a_branch(record=False, join_first=False)


@pytest.mark.strict_races
@pytest.mark.parametrize("record,join_first", [(True, False), (False, True)])
def test_a_recorded_stream_or_a_join_before_the_drop_is_clean(cuda_device, record, join_first):
    _drop_under_a_branch(record=record, join_first=join_first)


@pytest.mark.strict_races
def test_two_branches_writing_one_tensor_unjoined_race(cuda_device):
    out = torch.zeros(N, device="cuda")
    side = torch.cuda.Stream()

    def body() -> None:
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            out.fill_(1.0)
        out.fill_(2.0)
        main.wait_stream(side)

    with pytest.raises(RaceError, match="test_races_between_capture_branches.py"):
        _capture(body)


@pytest.mark.strict_races
def test_a_branch_joined_before_the_read_is_clean_and_replays(cuda_device):
    x = torch.full((N,), 2.0, device="cuda")
    out = torch.zeros(N, device="cuda")
    side = torch.cuda.Stream()

    def body() -> None:
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            partial = x * 3
        main.wait_stream(side)
        out.copy_(partial + x)

    graph = _capture(body)
    graph.replay()
    torch.cuda.synchronize()
    assert out.sum().item() == 8.0 * N


def test_a_forked_streams_freed_block_is_not_handed_to_the_capturing_stream(cuda_device):
    """The graph pool serves each stream from segments of its own, as CUDA's allocator does: a
    block freed by the forked stream goes back to that stream's segment only."""
    x = torch.arange(float(N), device="cuda")
    side = torch.cuda.Stream()
    addresses = {}

    def body() -> None:
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            scratch = x * 2
            addresses["side"] = scratch.data_ptr()
            del scratch
        main.wait_stream(side)
        mine = x * 3
        addresses["main"] = mine.data_ptr()

    _capture(body)
    assert addresses["main"] != addresses["side"]
