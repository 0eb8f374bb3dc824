"""Torch calls learned as one queued device op (call_patterns.py, `_queue`) under the adversarial
schedule give the races, reports, lines and values that dispatching their aten ops gives: the same
program runs with and without a pass-through dispatch mode of the caller's (which turns the patterns
off), and the reports must be the same text and every value the same bits, the poison a racing
read sees included."""

from __future__ import annotations

import pytest
import torch

import harness
from harness.emulation.tracking import RaceError
from fixtures.emulated_device import skip_unless_the_emulated_device_can_be_entered

from suites.streams._pass_through_mode import PassThrough

pytestmark = [pytest.mark.filterwarnings("ignore::harness.emulation.tracking.RaceWarning")]


def _racy_program() -> list[torch.Tensor]:
    """Races of each kind an eager step makes, every call seen once before (learned), and what
    the host reads back: a side stream's reads of work not yet run see its poison."""
    side = torch.cuda.Stream()
    x = torch.ones(4, 8, device="cuda")
    w = torch.randn(8, 8, device="cuda")
    rows = torch.arange(2, device="cuda")
    seen = []
    for _ in range(3):  # the first round learns each call's pattern, the later ones use it
        h = torch.matmul(x, w)  # the writer a side-stream reader races with
        y = (h * 2).float().reshape(32)
        with torch.cuda.stream(side):
            z = y + 1  # reads y before the default stream's write was waited for
            v = y[:8].view(2, 4) * 3
        torch.cuda.current_stream().wait_stream(side)
        u = torch.nn.functional.silu(z) + v.reshape(8).sum()
        with torch.cuda.stream(side):
            u2 = u * 0.5  # reads u before waiting for the default stream
        x.add_(u2.reshape(4, 8))  # in place: learned too
        x.index_put_((rows,), h[:2] * 0.25)  # a write into x while the side stream may read it
        staged = x * 4  # still queued when the caller drops it below
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            total = staged.sum(dim=1)  # queued on the side stream, reading `staged`
        del staged  # freed without record_stream while that read waits in the queue
        reused = x * 5  # the default stream's next block of that size: the same memory
        torch.cuda.synchronize()
        seen += [t.cpu() for t in (h, y, z, v, u, u2, x, total, reused)]
        seen.append(torch.tensor([x._version]))  # autograd's version counter, bumped at issue
    return seen


def _run(patterns_on: bool) -> tuple[list[str], list[torch.Tensor], int]:
    torch.manual_seed(0)
    with harness.emulate_cuda(device="cpu", schedule="adversarial", races="report") as state:
        if patterns_on:
            seen = _racy_program()
        else:
            with PassThrough():
                seen = _racy_program()
        tracking = state.streams_tracking
        return [str(r) for r in tracking.reports], seen, tracking.patterned_calls


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def test_queued_learned_calls_report_and_compute_what_dispatched_calls_do():
    skip_unless_the_emulated_device_can_be_entered()
    dispatched, dispatched_values, none = _run(patterns_on=False)
    learned, learned_values, used = _run(patterns_on=True)
    assert none == 0
    assert used > 0, "no call went through a learned pattern under the adversarial schedule"
    assert dispatched, "the program's races were not found"
    assert learned == dispatched
    assert any(t.isnan().any() for t in dispatched_values), "no read saw a queued op's poison"
    assert any("del staged" in r for r in dispatched), "the free under a queued read was not seen"
    assert len(learned_values) == len(dispatched_values)
    for i, (got, expected) in enumerate(zip(learned_values, dispatched_values)):
        assert _same_bits(got, expected), f"value {i} differs"


def test_a_learned_call_still_waits_in_its_queue():
    """The pattern queues the call: its result is poison until something waits for its stream,
    and a reader on another stream that did not wait still races with it."""
    skip_unless_the_emulated_device_can_be_entered()
    with harness.emulate_cuda(device="cpu", schedule="adversarial", races="strict") as state:
        side = torch.cuda.Stream()
        x = torch.ones(4, 4, device="cuda")
        for _ in range(2):
            before = state.streams_tracking.patterned_calls
            y = x * 2  # the second call is queued through the pattern the first one left
            torch.cuda.synchronize()
        learned = state.streams_tracking.patterned_calls == before + 1
        y = x * 2
        with torch.cuda.stream(side):
            with pytest.raises(RaceError) as raised:
                y - 1
        torch.cuda.synchronize()
    with harness.emulate_cuda(device="cpu", schedule="adversarial", races="report") as state:
        side = torch.cuda.Stream()
        x = torch.ones(4, 4, device="cuda")
        z = x * 3  # learned here, queued through the pattern below
        z = x * 3
        with torch.cuda.stream(side):
            early = z.cpu()  # the side stream's queue runs, not the default stream's: poison
        torch.cuda.synchronize()
        late = z.cpu()
        reports = [str(r) for r in state.streams_tracking.reports]
    assert learned, "the second x * 2 did not go through a pattern"
    text = str(raised.value)
    assert "aten.mul.Tensor writes it on stream 0 at" in text
    assert "y = x * 2" in text
    assert early.isnan().all()
    assert any("aten.mul.Tensor writes it on stream 0" in r and "z = x * 3" in r for r in reports)
    assert torch.equal(late, torch.full((4, 4), 3.0))


def test_a_queued_call_runs_in_the_state_it_was_issued_in():
    """Queued work runs as it was launched: an autocast the host entered before the queue ran
    recasts nothing, whether the aten op was queued (dispatched) or the whole call (learned)."""
    skip_unless_the_emulated_device_can_be_entered()
    results = []
    for patterns_on in (False, True):
        with harness.emulate_cuda(device="cpu", schedule="adversarial") as state:
            torch.manual_seed(0)
            a = torch.randn(16, 16, device="cuda")
            b = torch.randn(16, 16, device="cuda")
            with (PassThrough() if not patterns_on else torch.no_grad()):
                for _ in range(2):
                    before = state.streams_tracking.patterned_calls
                    out = torch.matmul(a, b)
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        torch.cuda.synchronize()  # the queued mm runs here
                used = state.streams_tracking.patterned_calls - before
                results.append((out.cpu(), used, torch.matmul(a.cpu(), b.cpu())))
    (dispatched, none, expected), (learned, used, _) = results
    assert none == 0 and used == 1
    assert _same_bits(dispatched, expected), "the queued aten op ran under the later autocast"
    assert _same_bits(learned, expected), "the queued call ran under the later autocast"


def _free_while_the_producer_waits() -> None:
    side = torch.cuda.Stream()
    x = torch.ones(1024, device="cuda")
    for _ in range(2):  # dispatched, then learned
        staged = x * 4  # its op waits in the default stream's queue, holding the result
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            staged.sum()
        del staged  # no record_stream: the side stream's read may still be pending
        torch.empty(1024, device="cuda").fill_(1)  # the freed block, reused
        torch.cuda.synchronize()


@pytest.mark.parametrize("patterns_on", [True, False], ids=["learned", "dispatched"])
def test_a_free_while_its_producer_still_waits_in_the_queue_is_reported(patterns_on):
    """The queued producer's own hold on its result is the queue's, not the caller's: without
    counting it, the caller's drop looked like a tensor still held and the race went unreported,
    though issue order reports it."""
    skip_unless_the_emulated_device_can_be_entered()
    with harness.emulate_cuda(device="cpu", schedule="adversarial", races="report") as state:
        if patterns_on:
            _free_while_the_producer_waits()
        else:
            with PassThrough():
                _free_while_the_producer_waits()
        reports = [str(r) for r in state.streams_tracking.reports]
    assert len([r for r in reports if "memory freed while another stream" in r]) == 2, reports


def _bare_storage_kept(hold_storage: bool) -> list[str]:
    """A caller's tensor read by a side-stream op that already ran from the queue (no host wait:
    the default stream is not ordered after it) is dropped while the program keeps its bare
    storage: CUDA frees nothing while the storage lives, so the default stream's next block of
    that size is other memory; the free comes when the storage goes."""
    side = torch.cuda.Stream()
    phases = []
    for _ in range(2):  # dispatched, then learned
        a = torch.ones(4096, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            a * 2  # queued on the side stream, reading a
            torch.randn(1, device="cuda")  # a seeded op cannot wait: the queue runs first
        kept = a.untyped_storage() if hold_storage else None
        del a  # the side stream's read is not ordered before the default stream's next work
        torch.empty(4096, device="cuda").fill_(1)  # a block of that size, on the default stream
        phases.append("held")
        del kept
        torch.empty(4096, device="cuda").fill_(1)
        phases.append("dropped")
        torch.cuda.synchronize()
    return phases


@pytest.mark.parametrize("schedule", ["adversarial", "issue_order"])
def test_a_bare_storage_kept_by_the_program_is_not_freed_with_its_last_tensor(schedule):
    """The storage the program holds keeps the allocation, under either schedule: the race is
    the reuse after the storage is dropped, reported there only."""
    skip_unless_the_emulated_device_can_be_entered()
    with harness.emulate_cuda(device="cpu", schedule=schedule, races="report") as state:
        _bare_storage_kept(hold_storage=True)
        reports = [str(r) for r in state.streams_tracking.reports]
    freed = [r for r in reports if "memory freed while another stream" in r]
    assert len(freed) == 2, reports
    assert all("del kept" in r for r in freed), freed
    assert not any("del a" in r for r in freed), freed


@pytest.mark.parametrize("schedule", ["adversarial", "issue_order"])
def test_the_last_tensor_dropped_without_a_kept_storage_is_the_free(schedule):
    """The same program holding no storage: the free is the drop of the tensor."""
    skip_unless_the_emulated_device_can_be_entered()
    with harness.emulate_cuda(device="cpu", schedule=schedule, races="report") as state:
        _bare_storage_kept(hold_storage=False)
        reports = [str(r) for r in state.streams_tracking.reports]
    freed = [r for r in reports if "memory freed while another stream" in r]
    assert len(freed) == 2 and all("del a" in r for r in freed), reports


def _parameter_before_a_raced_tensor() -> list[torch.Tensor]:
    """Calls whose positional tensors mix a Parameter (its mark read apart from the plain
    tensors' in the signature) with plain tensors, a side stream reading a plain one before
    waiting; the same call with a host and with a device 0-dim tensor after the Parameter (two
    signatures); and a queued result whose strides are not the ones `torch.full` would give."""
    side = torch.cuda.Stream()
    weight = torch.nn.Parameter(torch.randn(8, device="cuda"), requires_grad=False)
    x = torch.ones(8, device="cuda")
    row = torch.randn(1, 4, device="cuda")
    half = torch.tensor(0.5)  # a host scalar, which CUDA's kernels take beside device tensors
    seen = []
    for _ in range(3):  # the first round learns each call's pattern, the later ones use it
        y = x * 3  # the default stream's write the side stream races with
        total = y.sum()  # a device scalar, written on the default stream too
        with torch.cuda.stream(side):
            z = torch.where(y > 2, weight, y)  # the Parameter at 1, the raced y at 2
            w = torch.addcmul(weight, y, x)
            h = torch.where(x > 0, weight, half)
            t = torch.where(x > 0, weight, total)  # not the host call's pattern: reads `total`
        seen += [h.cpu(), t.cpu()]
        column = row.t().clone()  # shape (4, 1), strides (1, 4): contiguous, not full's
        torch.cuda.synchronize()
        seen += [z.cpu(), w.cpu(), column.cpu().reshape(4), torch.tensor(column.stride())]
    return seen


@pytest.mark.parametrize("schedule", ["adversarial", "issue_order"])
def test_calls_mixing_a_parameter_and_plain_tensors_report_what_dispatched_calls_do(schedule):
    """The placement mode hands the signature the storages it read, in argument order: each
    tensor must get its own (a Parameter's included), or a race on the plain tensor after it
    is reported on the wrong storage or not at all; and a queued result keeps its strides."""
    skip_unless_the_emulated_device_can_be_entered()
    runs = []
    for patterns_on in (False, True):
        torch.manual_seed(0)
        with harness.emulate_cuda(device="cpu", schedule=schedule, races="report") as state:
            with torch.no_grad():
                if patterns_on:
                    seen = _parameter_before_a_raced_tensor()
                else:
                    with PassThrough():
                        seen = _parameter_before_a_raced_tensor()
            tracking = state.streams_tracking
            runs.append(([str(r) for r in tracking.reports], seen, tracking.patterned_calls))
    (dispatched, dispatched_values, none), (learned, learned_values, used) = runs
    assert none == 0 and used > 0
    assert any("torch.where(y > 2, weight, y)" in r for r in dispatched), dispatched
    assert any("torch.addcmul(weight, y, x)" in r for r in dispatched), dispatched
    assert any("torch.where(x > 0, weight, total)" in r for r in dispatched), dispatched
    assert learned == dispatched
    assert torch.equal(learned_values[-1], torch.tensor([1, 4]))
    for i, (got, expected) in enumerate(zip(learned_values, dispatched_values)):
        assert _same_bits(got, expected), f"value {i} differs"
