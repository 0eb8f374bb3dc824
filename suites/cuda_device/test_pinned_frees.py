"""Freeing pinned host memory right after a non-blocking copy to or from it. CUDA's copy records an
event on the pinned block (CachingHostAllocator_recordEvent), and the host allocator hands the
block out again only once the copy is done: the free is safe. The emulated device's stream tracking
held pinned blocks to the device allocator's rule (record_stream, or a wait before the last
reference goes) and reported a race, found on transformers' offloaded KV cache (its `prefetch`
drops the offloaded copy as soon as the copy back to the device is issued). A device tensor read
on another stream and freed without record_stream, its block reused by the freeing stream's next
allocation, is still a race."""

from __future__ import annotations

import torch
import warnings

import harness
from harness.emulation.tracking import RaceKind


def _races(program) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # races="report" also warns of each race
        with harness.emulate_cuda(device="cpu", races="report") as state:
            program()
            torch.cuda.synchronize()
            return [report.kind for report in state.streams_tracking.reports]


def _pinned_source_dropped_after_its_copy():
    side = torch.cuda.Stream()
    host = torch.arange(8.0, device="cuda").to("cpu", non_blocking=True)  # pinned, as ATen makes it
    torch.cuda.synchronize()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        back = host.to("cuda", non_blocking=True)
        del host  # the host allocator holds the block until the copy is done
    torch.cuda.current_stream().wait_stream(side)
    assert back.tolist() == [float(i) for i in range(8)]


def _pinned_target_dropped_after_its_copy():
    side = torch.cuda.Stream()
    source = torch.arange(4.0, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        target = torch.empty(4, pin_memory=True)
        target.copy_(source, non_blocking=True)
        del target
    torch.cuda.current_stream().wait_stream(side)  # before `source` goes


def _device_tensor_freed_while_another_stream_reads_it():
    side = torch.cuda.Stream()
    data = torch.ones(1 << 10, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        data.sum()
    del data
    torch.ones(1 << 10, device="cuda")  # the main stream's next allocation may take data's block


def test_a_pinned_source_dropped_after_its_copy_is_issued_is_no_race(outside_emulation):
    assert _races(_pinned_source_dropped_after_its_copy) == []


def test_a_pinned_target_dropped_after_its_copy_is_issued_is_no_race(outside_emulation):
    assert _races(_pinned_target_dropped_after_its_copy) == []


def test_a_device_tensor_freed_while_another_stream_reads_it_is_still_a_race(outside_emulation):
    assert _races(_device_tensor_freed_while_another_stream_reads_it) == [RaceKind.FREED_IN_USE]
