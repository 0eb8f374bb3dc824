"""A replay of a graph whose input, allocated outside the capture, was freed since (PyTorch's
_capture_trivial_graph: `x + 1` captured on a local `x` that dies when the helper returns). CUDA's
graph keeps the address: the freed block stays in the allocator's cache and the replay reads (and
writes) its bytes silently, until the allocator hands it out again. The emulated device refuses
such a replay under strict race checking (a use-after-free it exists to catch); under races
"report" it warns and replays on the bytes the memory held when it was freed, and under "off" it
replays in silence (needs torch 2.12's swap of a storage's memory; older builds refuse in every
mode)."""

from __future__ import annotations

import pytest
import torch

import harness
from harness.graphs import FreedMemoryError
from harness.torch_internals import optional_name

KEEPS_BYTES = optional_name("storage_swap_data_ptr") is not None


def _replayed_after_the_input_died(races: str) -> list[float]:
    """Capture y = x + 1 and x.mul_(2) on an x of 3s, drop x, replay twice: y's values."""
    with harness.emulate_cuda(device="cpu", races=races):
        x = torch.full((8,), 3.0, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x + 1
            x.mul_(2)  # a write into the freed memory at each replay
        del x
        g.replay()
        g.replay()
        torch.cuda.synchronize()
        return y.tolist()


def test_strict_races_refuse_a_replay_of_freed_memory(outside_emulation):
    with pytest.raises(FreedMemoryError, match="its last reference was dropped since capture"):
        _replayed_after_the_input_died("strict")


@pytest.mark.skipif(not KEEPS_BYTES, reason="this torch cannot swap a storage's memory (< 2.12)")
def test_races_report_warns_and_replays_on_the_freed_bytes(outside_emulation):
    from harness.emulation.tracking import RaceWarning

    with pytest.warns(RaceWarning, match="the replay reads and writes the bytes the memory held "
                                         "when it was freed") as warned:
        # x held 3s when freed (the capture only recorded the mul_); the first replay reads 3s
        # and doubles them, the second reads 6s: what CUDA's replays read from the cached block
        assert _replayed_after_the_input_died("report") == [7.0] * 8
    assert len([w for w in warned if "FreedMemoryError" in str(w.message)]) == 2  # one a replay


@pytest.mark.skipif(not KEEPS_BYTES, reason="this torch cannot swap a storage's memory (< 2.12)")
def test_races_off_replays_on_the_freed_bytes_in_silence(outside_emulation, recwarn):
    assert _replayed_after_the_input_died("off") == [7.0] * 8
    assert not [w for w in recwarn if "FreedMemoryError" in str(w.message)]
