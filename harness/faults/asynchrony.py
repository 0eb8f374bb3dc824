"""Faults of the asynchronous class, planted in harness.runtime.async_io: each removes the one wait
that makes a piece of an overlapping step loop correct. On the emulated CUDA device the stream
tracker raises at the race (strict); on a GPU the detector stalls the producing stream with
torch.cuda._sleep, and the race gives wrong values."""

from __future__ import annotations

import contextlib
from typing import Iterator

from harness.faults.patching import replace_function
from harness.faults.registry import Fault, FaultHandle
from harness.runtime import async_io

DETECTORS = "suites/streams/test_async_io.py::"


def _skipping(name: str):
    """A fault that turns `async_io.name` into a no-op that fires the handle."""
    @contextlib.contextmanager
    def plant(handle: FaultHandle) -> Iterator[None]:
        def make(original):
            def planted(*args, **kwargs):
                handle.fire()
            return planted

        with replace_function(async_io, name, make):
            yield
    return plant


HOST_WRITE = r"host write while device work on the memory is pending|assert \[.*\] == \["
HOST_READ = r"host read before the device work writing the memory was waited for|assert .* == 6\.0"

ASYNC_FAULTS = (
    Fault(
        name="pinned-staging-reused-before-copy",
        bug_class="a pinned host staging buffer is refilled for the next step before the "
                  "non_blocking copy that reads it has run",
        link="https://github.com/vllm-project/vllm/pull/24527",
        detector=DETECTORS + "test_pinned_staging_refills_a_buffer_after_its_copy",
        expected=HOST_WRITE,
        plant=_skipping("wait_until_reusable"),
    ),
    Fault(
        name="inputs-written-during-replay",
        bug_class="the next step's inputs are written into the pinned buffer a graph re-reads "
                  "while the previous replay is still in flight",
        link="https://github.com/sgl-project/sglang/pull/31686",
        detector=DETECTORS + "test_staged_graph_inputs_wait_for_the_previous_replay",
        expected=HOST_WRITE,
        plant=_skipping("wait_for_replay"),
    ),
    Fault(
        name="output-read-before-copy",
        bug_class="a graph's output, copied to pinned memory with non_blocking=True, is read on "
                  "the host before the copy landed",
        link="https://github.com/vllm-project/vllm/pull/36013",
        detector=DETECTORS + "test_pinned_readback_reads_what_the_device_wrote",
        expected=HOST_READ,
        plant=_skipping("wait_for_copy"),
    ),
    Fault(
        name="side-stream-without-wait-stream",
        bug_class="work on a side stream reads what the main stream writes, without wait_stream "
                  "or an event between them",
        link="https://github.com/sgl-project/sglang/pull/18746",
        detector=DETECTORS + "test_side_stream_work_sees_the_producers_writes",
        expected=r"streams touching the same memory without an event or wait_stream|assert .* == 6\.0",
        plant=_skipping("order_side_stream"),
    ),
    Fault(
        name="freed-without-record-stream",
        bug_class="a tensor used on a side stream is freed without record_stream: the main "
                  "stream's next allocation reuses it while the side stream still reads it",
        link="https://github.com/sgl-project/sglang/pull/18744",
        detector=DETECTORS + "test_side_stream_inputs_outlive_their_last_tensor",
        expected=r"memory freed while another stream's work may still use it|assert .* == 1\.0",
        plant=_skipping("keep_for_stream"),
    ),
    Fault(
        name="captured-collective-not-waited",
        bug_class="a collective captured in a graph is never waited for: its work is forked off "
                  "the capturing stream and not joined back",
        link="https://github.com/vllm-project/vllm/issues/25906",
        detector="suites/distributed/test_captured_collectives.py::"
                 "test_a_data_parallel_step_agrees_with_eager_on_every_replay",
        expected=r"collective\(s\) never waited for|[Uu]njoined",
        plant=_skipping("wait_collective"),
    ),
)
