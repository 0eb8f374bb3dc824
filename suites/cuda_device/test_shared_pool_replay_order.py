"""Two graphs captured into one pool, the second reading the first's output and then allocating
over its bytes (PyTorch's test_graph_two_successive, a runtime capturing one step after another
into a shared pool). Replayed in capture order the second graph reads what the first wrote, before
it writes its own values there: CUDA gives the right result, and so must the emulated device with
its stream tracking, where each replay is launched (refused or renewed) before it runs. A replay
of the second graph with no replay of the first in between reads its own leftovers, silently on
CUDA; the emulated device refuses it."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import FreedMemoryError

SIZE = 1000


def _with_temps(t: torch.Tensor, val: float) -> torch.Tensor:
    x = t.clone() + val
    y = t.clone() + val
    return x + y


def _two_graphs_one_pool():
    a = torch.ones((SIZE,), device="cuda")
    g0, g1 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        g0.capture_begin()
        b = a.clone()
        for _ in range(2):
            b = _with_temps(b, 1)
        g0.capture_end()
        # g0's output is read, dropped while `b` is rebound, and its bytes handed to g1's temps.
        g1.capture_begin(g0.pool())
        for _ in range(2):
            b = _with_temps(b, 1)
        g1.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    return a, g0, g1, b


def test_replays_in_capture_order_read_the_first_graphs_values(cuda_kind):
    a, g0, g1, b = _two_graphs_one_pool()
    for _ in range(2):
        g0.replay()
        g1.replay()
        # 1 -> 4 -> 10 after g0; -> 22 -> 46 after g1
        assert b.sum().item() == SIZE * 46


def test_a_replay_of_the_reader_alone_after_its_own_replay_is_refused(cuda_device):
    a, g0, g1, b = _two_graphs_one_pool()
    g0.replay()
    g1.replay()
    with pytest.raises(FreedMemoryError, match="overwritten by another graph"):
        g1.replay()


def _three_graphs_out_of_order(races: str, device: str = "cpu"):
    """PyTorch's test_graph_three_successive: g2's capture is handed the bytes of `c`, which g1
    reads; replayed g0, g2, g1, g1 reads g2's values (what CUDA gives, silently). `device`:
    "cuda" is the graph sanitizer, on a GPU."""
    import harness

    with harness.emulate_cuda(device=device, races=races):
        a = torch.ones((SIZE,), device="cuda")
        g0, g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            g0.capture_begin()
            b = a.clone()
            c, d = b + 1, b + 2
            g0.capture_end()
            g1.capture_begin(pool=g0.pool())
            e = c + 3
            del c
            g1.capture_end()
            g2.capture_begin(pool=g0.pool())
            f = d + 4
            g2.capture_end()
        torch.cuda.current_stream().wait_stream(s)
        for graph in (g0, g2, g1):
            graph.replay()
        return e.sum().item(), f.sum().item()


def test_races_report_warns_of_an_overwritten_read_and_replays_cudas_values(outside_emulation):
    from harness.emulation.tracking import RaceWarning

    with pytest.warns(RaceWarning, match="reads pool memory overwritten by another graph"):
        assert _three_graphs_out_of_order("report") == (SIZE * (7 + 3), SIZE * 7)


def test_races_off_replays_cudas_values_in_silence(outside_emulation, recwarn):
    assert _three_graphs_out_of_order("off") == (SIZE * (7 + 3), SIZE * 7)
    assert not [w for w in recwarn if "overwritten" in str(w.message)]


@pytest.mark.gpu
@pytest.mark.parametrize("races", ["strict", "report"])
def test_the_graph_sanitizer_takes_the_races_setting_for_an_overwritten_read(outside_emulation,
                                                                              races):
    """In the sanitizer the real allocator hands g2 the bytes of `c` as CUDA does; until
    2026-12-07 it refused any races setting, so the replay always raised and PyTorch's
    test_graph_three_successive, which asserts the values CUDA reads, failed there."""
    from harness.emulation.tracking import RaceWarning

    if not torch.cuda.is_available():
        pytest.skip("the graph sanitizer runs on a GPU")
    if races == "strict":
        with pytest.raises(FreedMemoryError, match="reads pool memory overwritten by another graph"):
            _three_graphs_out_of_order(races, device="cuda")
        return
    with pytest.warns(RaceWarning, match="reads pool memory overwritten by another graph"):
        assert _three_graphs_out_of_order(races, device="cuda") == (SIZE * (7 + 3), SIZE * 7)


def test_strict_races_refuse_the_overwritten_read(outside_emulation):
    with pytest.raises(FreedMemoryError, match="reads pool memory overwritten by another graph"):
        _three_graphs_out_of_order("strict")
