"""Faults planted in the overlap loop (harness.runtime.overlap) and its staging
(harness.ops.metadata): the loop's classic bugs, each an ordering that the loop relies on.

Their detector stalls the stream at the start of every step (`Engine.before_launch`), so the host
runs ahead as far as the loop lets it: on a GPU, and on the emulated CUDA device under its
adversarial schedule, where every copy, event and replay waits in its stream's queue until something
synchronizes with it. There a broken ordering gives the wrong tokens a loaded GPU gives, or a race
report naming the tensor and both lines, or both.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from harness.faults.patching import replace_function, replace_method
from harness.faults.registry import Fault, FaultHandle
from harness.ops.metadata import AttentionMetadata
from harness.runtime import overlap

DETECTOR = "suites/decoder/test_overlap.py::test_overlap_under_a_stalled_stream_matches_the_loop_without"
# Different tokens (a GPU, the emulated device), or a race the emulated device's tracker reported.
EXPECTED = r"(?s)overlap under a stalled stream: .*(race on tensor|divergence)"


@contextlib.contextmanager
def one_staging_buffer_for_two_steps(handle: FaultHandle) -> Iterator[None]:
    def make(next_staging):
        def planted(self):
            handle.fire()
            # Always the first buffer, and no wait: the next step's metadata overwrites it while
            # the copy of the step still queued has yet to read it.
            return 0
        return planted

    with replace_method(AttentionMetadata, "next_staging", make):
        yield


@contextlib.contextmanager
def tokens_read_before_their_event(handle: FaultHandle) -> Iterator[None]:
    def make(wait_for_tokens):
        def planted(step):
            handle.fire()  # the pinned buffer is read as it is: maybe before the copy landed
        return planted

    with replace_function(overlap, "wait_for_tokens", make):
        yield


@contextlib.contextmanager
def inputs_written_while_a_replay_is_in_flight(handle: FaultHandle) -> Iterator[None]:
    side_streams: dict[torch.device, torch.cuda.Stream] = {}

    def make(copy_to_device):
        def planted(dst, src):
            if dst.device.type != "cuda":
                return copy_to_device(dst, src)
            handle.fire()
            # A side stream that does not wait for the queued replays: the write lands while the
            # replay that reads `dst` is still in flight. The compute stream waits for the write,
            # so this step itself sees it.
            side = side_streams.setdefault(dst.device, torch.cuda.Stream(dst.device))
            with torch.cuda.stream(side):
                dst.copy_(src, non_blocking=True)
            torch.cuda.current_stream(dst.device).wait_stream(side)
        return planted

    with replace_function(overlap, "copy_to_device", make):
        yield


OVERLAP_FAULTS = (
    Fault(
        name="one-staging-buffer-for-two-steps",
        bug_class="one pinned staging buffer for two steps in flight: the host stages step n + 1's "
                  "metadata over step n's before the device copied it",
        link="https://github.com/NVIDIA/TensorRT-LLM/pull/15546",
        detector=DETECTOR,
        expected=EXPECTED,
        plant=one_staging_buffer_for_two_steps,
    ),
    Fault(
        name="tokens-read-before-their-event",
        bug_class="the sampled tokens are read from pinned host memory before the event behind "
                  "their non-blocking copy has passed",
        link="https://github.com/NVIDIA/TensorRT-LLM/pull/10610",
        detector=DETECTOR,
        expected=EXPECTED,
        plant=tokens_read_before_their_event,
    ),
    Fault(
        name="inputs-written-while-a-replay-is-in-flight",
        bug_class="the next step's inputs are written outside the stream order (a side stream that "
                  "does not wait), while the replay that reads them is still queued",
        link="https://github.com/sgl-project/sglang/pull/26380",
        detector=DETECTOR,
        expected=EXPECTED,
        plant=inputs_written_while_a_replay_is_in_flight,
    ),
)
