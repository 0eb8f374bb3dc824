"""A capture's forks and joins (emulation/tracking/capture_forks.py), driven on a CPU as the graph
sanitizer drives them: streams named by the real streams' ids (`StreamIds`), each captured op a
launch, each `Event.record`/`Event.wait` an edge on the event's id. The sanitizer itself needs a
GPU; the emulated device's capture rules use the same object (its rows in suites/cuda_device and
suites/public_bugs). CUDA ends a capture whose fork has work the capturing stream never waited
for with cudaErrorStreamCaptureUnjoined; joined after the fork's last op, it ends."""

from __future__ import annotations

import types

import pytest

from harness.emulation.tracking.capture_forks import CaptureForks
from harness.emulation.tracking.clocks import Clocks
from harness.emulation.tracking.real_streams import StreamIds

UNJOINED = "CUDA error: capturing stream has unjoined work"


def _stream(stream_id: int, handle: int):
    return types.SimpleNamespace(device_index=0, stream_id=stream_id, cuda_stream=handle)


class _Capture:
    """One capture on `main`, with the edges as the sanitizer's Event patches note them."""

    def __init__(self) -> None:
        self.main, self.side = _stream(3, 0x30), _stream(4, 0x40)
        self.forks = CaptureForks(self.main, StreamIds().of, Clocks())
        self._events = 0

    def op(self, stream) -> None:
        self.forks.ran(stream, self.forks.launch(stream))

    def record(self, stream) -> int:
        self._events += 1
        self.forks.clocks.record_event(self._events, self.forks.key(stream))
        return self._events

    def wait(self, stream, event: int) -> None:
        self.forks.clocks.wait_event(self.forks.key(stream), event)

    def fork(self) -> None:  # side.wait_stream(main): a record on main, a wait on side
        self.wait(self.side, self.record(self.main))

    def join(self) -> None:  # main.wait_stream(side)
        self.wait(self.main, self.record(self.side))


@pytest.mark.parametrize("joined", [False, True])
def test_a_forks_work_must_be_joined_back_before_the_capture_ends(joined):
    capture = _Capture()
    capture.op(capture.main)
    capture.fork()
    capture.op(capture.side)
    if joined:
        capture.join()
    capture.op(capture.main)
    error = capture.forks.unjoined_error()
    if joined:
        assert error is None
    else:
        assert error is not None and str(error).startswith(UNJOINED)
        assert "work on stream 4 not joined back to the capturing stream 3" in str(error)


def test_work_on_the_fork_after_its_join_is_unjoined_again():
    capture = _Capture()
    capture.fork()
    capture.op(capture.side)
    capture.join()
    capture.op(capture.side)  # a last op the capturing stream never waited for
    assert str(capture.forks.unjoined_error()).startswith(UNJOINED)


def test_an_event_recorded_before_the_forks_last_op_does_not_join_it():
    capture = _Capture()
    capture.fork()
    capture.op(capture.side)
    early = capture.record(capture.side)
    capture.op(capture.side)
    capture.wait(capture.main, early)
    assert str(capture.forks.unjoined_error()).startswith(UNJOINED)


def test_a_wrapper_of_the_capturing_streams_handle_is_no_fork():
    capture = _Capture()
    wrapper = _stream(0x30, 0x30)  # an ExternalStream of main's handle: its own id, main's queue
    capture.op(wrapper)
    assert capture.forks.unjoined_error() is None
