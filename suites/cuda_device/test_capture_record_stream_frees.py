"""A block freed during a capture after `record_stream` on other streams, as CUDA's allocator holds
it: not reused before the capture ends, or with `graph_capture_record_stream_reuse:True` not before
the allocating stream has joined every stream that used it (PyTorch's
test_graph_capture_reclaim_{2,4}_streams). Without record_stream the block is reused at once.

On a GPU these run against CUDA itself (natively; the graph sanitizer's pools are the emulator's
arena over real memory, with real streams it does not follow, so it is skipped)."""

from __future__ import annotations

import contextlib

import pytest
import torch

import harness
from harness.emulation import emulation_active


@pytest.fixture(autouse=True)
def device():
    with contextlib.ExitStack() as stack:
        if emulation_active() == "cuda":
            pytest.skip("the graph sanitizer does not follow real streams' record_stream")
        if emulation_active() is None and not torch.cuda.is_available():
            stack.enter_context(harness.emulate_cuda(device="cpu"))
        yield


@pytest.fixture
def reuse_after_join():
    torch.cuda.memory._set_allocator_settings("graph_capture_record_stream_reuse:True")
    yield
    torch.cuda.memory._set_allocator_settings("graph_capture_record_stream_reuse:False")


def capture(body) -> torch.cuda.CUDAGraph:
    g = torch.cuda.CUDAGraph(keep_graph=True)
    main = torch.cuda.Stream()
    main.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(main):
        g.capture_begin()
        body(main)
        g.capture_end()
    torch.cuda.current_stream().wait_stream(main)
    return g


def used_on(side: torch.cuda.Stream, main: torch.cuda.Stream) -> tuple:
    """A block made on `main`, read on `side` (record_stream), freed on `main` at the return; its
    pointer, and `side`'s output."""
    data = torch.empty(64, device="cuda")
    side.wait_stream(main)
    with torch.cuda.stream(side):
        out = data + 1
        data.record_stream(side)
    return data.data_ptr(), out


def test_without_record_stream_the_freed_block_is_reused_at_once():
    ptrs = {}

    def body(main):
        side = torch.cuda.Stream()
        data = torch.empty(64, device="cuda")
        side.wait_stream(main)
        with torch.cuda.stream(side):
            ptrs["out"] = data + 1
        main.wait_stream(side)
        ptrs["freed"] = data.data_ptr()
        del data
        ptrs["next"] = torch.empty(64, device="cuda").data_ptr()

    capture(body)
    assert ptrs["next"] == ptrs["freed"]


def test_by_default_a_recorded_block_waits_for_the_capture_end():
    ptrs = {}

    def body(main):
        side = torch.cuda.Stream()
        ptrs["freed"], ptrs["out"] = used_on(side, main)
        main.wait_stream(side)  # joined, but the default waits for the capture's end
        ptrs["next"] = torch.empty(64, device="cuda").data_ptr()

    capture(body)
    assert ptrs["next"] != ptrs["freed"]


def test_with_reuse_after_join_the_block_waits_for_the_join(reuse_after_join):
    ptrs = {}

    def body(main):
        side = torch.cuda.Stream()
        ptrs["freed"], ptrs["out"] = used_on(side, main)
        ptrs["before_join"] = torch.empty(64, device="cuda").data_ptr()
        main.wait_stream(side)
        ptrs["after_join"] = torch.empty(64, device="cuda").data_ptr()

    capture(body)
    assert ptrs["before_join"] != ptrs["freed"]
    assert ptrs["after_join"] == ptrs["freed"]


def test_a_join_through_an_event_and_a_third_stream_counts(reuse_after_join):
    ptrs = {}

    def body(main):
        side, relay = torch.cuda.Stream(), torch.cuda.Stream()
        ptrs["freed"], ptrs["out"] = used_on(side, main)
        relay.wait_stream(side)  # relay comes after side's use
        with torch.cuda.stream(relay):
            ptrs["relay_out"] = ptrs["out"] * 2
        ptrs["unjoined"] = torch.empty(64, device="cuda").data_ptr()
        done = torch.cuda.Event()
        done.record(relay)
        main.wait_event(done)  # main has now joined side through relay
        ptrs["joined"] = torch.empty(64, device="cuda").data_ptr()

    capture(body)
    assert ptrs["unjoined"] != ptrs["freed"]
    assert ptrs["joined"] == ptrs["freed"]


def test_a_bad_value_for_the_option_is_refused():
    with pytest.raises((RuntimeError, ValueError)):
        torch.cuda.memory._set_allocator_settings("graph_capture_record_stream_reuse:yes")
