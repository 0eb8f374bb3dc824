"""The stream tracking's shortcuts give the answers of the long way: whether a copy blocks the host,
read off its arguments as aten passes them, agrees with the schema-bound answer for every way a copy
is called; a fresh result forgets the streams recorded on the storage's previous tenant; a stream
that launched before the host waited is ordered after what the host waited for."""

from __future__ import annotations

import pytest
import torch

from harness.graphs.emulator import opinfo
from harness.graphs.emulator.accesses import copy_blocks_host
from harness.emulation.tracking import RaceKind, StreamTracker

# These cases make races on purpose; report mode's RaceWarning for each is expected.
pytestmark = pytest.mark.filterwarnings("ignore::harness.emulation.tracking.RaceWarning")

aten = torch.ops.aten
S0, S1, S2 = 0, 1, 2
A, B, C = 100, 200, 300  # storages


def _bound_answer(func, args, kwargs, is_device, is_pinned, targets_device) -> bool:
    """The rule from the copy's bound schema arguments (what blocks_host asked before)."""
    named = opinfo.bind(func, args, kwargs)
    if func is aten._to_copy.default:
        src = named["self"]
        crosses = named.get("device") is not None and is_device(src) != targets_device
        return crosses and not (named.get("non_blocking") and is_pinned(src))
    host = [t for t in (named["self"], named["src"]) if not is_device(t)]
    if not host or len(host) == 2:
        return False
    return not (named.get("non_blocking") and is_pinned(host[0]))


DEVICE, PINNED, PAGEABLE = torch.zeros(2), torch.zeros(2), torch.zeros(2)
KIND = {id(DEVICE): "device", id(PINNED): "pinned", id(PAGEABLE): "pageable"}


def _is_device(t: torch.Tensor) -> bool:
    return KIND[id(t)] == "device"


def _is_pinned(t: torch.Tensor) -> bool:
    return KIND[id(t)] == "pinned"


COPY_CALLS = [
    *[(aten.copy_.default, (dst, src), {}) for dst in (DEVICE, PINNED, PAGEABLE)
      for src in (DEVICE, PINNED, PAGEABLE)],
    *[(aten.copy_.default, (dst, src, True), {}) for dst, src in
      ((DEVICE, PINNED), (DEVICE, PAGEABLE), (PINNED, DEVICE), (PAGEABLE, DEVICE))],
    *[(aten.copy_.default, (dst, src), {"non_blocking": True}) for dst, src in
      ((DEVICE, PINNED), (PAGEABLE, DEVICE))],
    (aten.copy.default, (DEVICE, PINNED, True), {}),
    (aten.copy.default, (PAGEABLE, DEVICE), {}),
    *[(aten._to_copy.default, (src,), kwargs) for src in (DEVICE, PINNED, PAGEABLE)
      for kwargs in ({}, {"dtype": torch.float16}, {"device": torch.device("cpu")},
                     {"device": torch.device("cpu"), "non_blocking": True})],
]


@pytest.mark.parametrize("targets_device", [False, True])
@pytest.mark.parametrize("call", COPY_CALLS, ids=lambda c: f"{c[0]}-{len(c[1])}-{sorted(c[2])}")
def test_a_copy_blocks_the_host_as_its_bound_arguments_say(call, targets_device):
    func, args, kwargs = call
    expected = _bound_answer(func, args, kwargs, _is_device, _is_pinned, targets_device)
    assert copy_blocks_host(func, args, kwargs, _is_device, _is_pinned, targets_device) is expected


def test_the_copy_rule_is_not_vacuous():
    answers = {copy_blocks_host(f, a, k, _is_device, _is_pinned, t)
               for f, a, k in COPY_CALLS for t in (False, True)}
    assert answers == {True, False}


def test_a_fresh_result_forgets_the_streams_recorded_on_the_previous_tenant():
    tracker = StreamTracker(mode="report")
    tracker.launch(S0, writes=[A])
    tracker.wait_stream(S1, S0)
    tracker.launch(S1, reads=[A], writes=[B])
    tracker.record_stream(A, S1)
    seq = tracker.launch(S0)  # the next tenant of A's memory, a fresh result on S0
    tracker.record_write(A, S0, seq, op="aten.empty")
    tracker.wait_stream(S1, S0)
    tracker.launch(S1, reads=[A], writes=[B])  # used on S1 again, without record_stream
    tracker.free(A, allocation_stream=S0)
    tracker.allocate(C, S0, nbytes=1)  # S0's next allocation: perhaps A's block
    tracker.launch(S0, writes=[C])
    assert [r.kind for r in tracker.reports] == [RaceKind.FREED_IN_USE]


def test_a_stream_that_launched_before_the_host_waited_is_ordered_after_it():
    tracker = StreamTracker(mode="report")
    tracker.launch(S2, writes=[B])  # S2 has joined the host's clock once already
    tracker.launch(S1, writes=[A])
    tracker.synchronize_stream(S1)
    tracker.launch(S2, reads=[A])  # after the host waited for S1's write
    tracker.record_event(7, S2)
    tracker.wait_event(S0, 7)
    tracker.launch(S0, writes=[A])  # ordered after S2's read through the event
    assert tracker.reports == []
    tracker.launch(S1, writes=[B])  # S2's write of B: S1 never waited for it
    assert [r.kind for r in tracker.reports] == [RaceKind.UNSYNCHRONIZED_STREAMS]
