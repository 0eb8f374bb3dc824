"""The overlap loop with decode graphs: the generations of the loop without overlap on the session's
graph backend (exactly on the emulator), and under a stalled stream that opens every window the
loop's synchronization closes, on a GPU or on the emulated CUDA device under its adversarial
schedule with no race reported (the detector of the overlap faults)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import pytest
import torch

import harness
from fixtures.models import step_values
from harness.check.compare import compare_generations
from harness.graphs import GraphBackend, get_backend
from harness.emulation import emulation_active
from harness.model import ReferenceLlama
from fixtures.emulated_device import skip_unless_the_emulated_device_can_be_entered

STALL_CYCLES = 20_000_000  # about 10 ms on an H200: longer than a tiny decode step's host work


@pytest.mark.parametrize("graph_top_k", [pytest.param((), marks=pytest.mark.slow), (2,)],
                         ids=["host-ranked-graphs", "graph-ranked"])
def test_overlap_with_decode_graphs_matches_the_loop_without(make_engine, decode_requests, graph_top_k,
                                                            graph_backend):
    expected = make_engine(graph_top_k=graph_top_k).generate(decode_requests)
    engine = make_engine(graph_top_k=graph_top_k, overlap=True)
    actual = engine.generate(decode_requests)
    comparison = compare_generations(expected, actual)
    assert comparison.ok, str(comparison)
    if graph_backend.name == "emulated":
        assert step_values(actual) == step_values(expected)
    assert sum(engine.stats.replays.values()) > 0
    assert not engine.stats.fallbacks, dict(engine.stats.fallbacks)


def stall_stream() -> None:
    torch.cuda._sleep(STALL_CYCLES)


@dataclass(frozen=True)
class StalledDevice:
    model: ReferenceLlama  # on "cuda"
    backend: GraphBackend
    tracking: Any | None  # the emulated device's stream tracking; None on a real GPU


@pytest.fixture
def stalled_device(request, graph_backend, tiny_hf_model) -> Iterator[StalledDevice]:
    """CUDA for the stalled run: the real GPU under --graph-backend cuda; elsewhere the emulated
    CUDA device under the adversarial schedule (each stream's work waits until something
    synchronizes with it), its races reported rather than raised, so one run shows them all."""
    if graph_backend.name == "cuda":
        yield StalledDevice(request.getfixturevalue("device_reference_llama"), graph_backend, None)
        return
    skip_unless_the_emulated_device_can_be_entered()
    with harness.emulate_cuda(device="cpu", schedule="adversarial", races="report") as state:
        model = ReferenceLlama.from_hf(tiny_hf_model).to("cuda")
        yield StalledDevice(model, get_backend("cuda", "cuda"), state.streams_tracking)


def name_tensors(device: StalledDevice, engine) -> None:
    """Race reports name the engine's tensors by path (`engine.input_ids`)."""
    if device.tracking is not None:
        device.tracking.name_tensors(engine, "engine")


def races_found(tracking: Any | None) -> str:
    reports = [] if tracking is None else tracking.reports
    if not reports:
        return ""
    shown = "\n".join(str(r) for r in reports[:3])
    return f"{len(reports)} race(s) on the emulated device, the first:\n{shown}\n"


def test_overlap_under_a_stalled_stream_matches_the_loop_without(make_engine, decode_requests,
                                                                  stalled_device):
    """Every step's device work is queued behind a sleep: the host runs ahead as far as the loop
    lets it, so a staging buffer reused too early, tokens read before their event or inputs written
    outside the stream order show up as different tokens (on a GPU and on the emulated device) or
    as a race naming the tensor and both lines (on the emulated device)."""
    model, backend = stalled_device.model, stalled_device.backend
    expected = make_engine(model=model, backend=backend, graph_top_k=(2,)).generate(decode_requests)
    engine = make_engine(model=model, backend=backend, graph_top_k=(2,), overlap=True)
    name_tensors(stalled_device, engine)
    engine.prepare_graphs()
    torch.cuda.synchronize()
    name_tensors(stalled_device, engine)  # the metadata of the final KV cache too
    engine.before_launch = stall_stream
    actual = engine.generate(decode_requests)
    comparison = compare_generations(expected, actual)
    races = races_found(stalled_device.tracking)
    assert comparison.ok and not races, f"overlap under a stalled stream: {races}{comparison}"
    if stalled_device.tracking is not None:  # the emulated device runs the cpu's kernels: exactly
        assert step_values(actual) == step_values(expected)
    assert sum(engine.stats.replays.values()) > 0


def test_the_steady_feed_copies_a_previous_step_of_exactly_its_rows():
    from harness.runtime.overlap import InputFeed, TokenFeed

    input_ids = torch.full((8,), -1, dtype=torch.int64)
    feed = InputFeed(input_ids, max_batch_size=4)
    feed.feed = TokenFeed(torch.tensor([70, 71]), (0, 1), (0, 1))
    feed.write(input_ids, [5, 6])
    assert input_ids.tolist() == [70, 71] + [-1] * 6


def test_pinned_turns_hand_out_each_buffer_in_turn_as_the_asked_shape():
    """The output staging of the overlap loop: buffers alternate, a shape's view of a buffer is
    made once (the loop asks for the same shape every step), and a shape past the buffer is refused
    with its size."""
    from harness.runtime.overlap import PinnedTurns

    turns = PinnedTurns(12, torch.float32, torch.device("cpu"))
    first, _ = turns.next_view((2, 3))
    second, _ = turns.next_view((2, 3))
    again, _ = turns.next_view((2, 3))
    assert first.shape == (2, 3) and first.data_ptr() == turns.buffers[0].data_ptr()
    assert second.data_ptr() == turns.buffers[1].data_ptr()
    assert again is first
    first.fill_(1.0)
    assert turns.buffers[0][:6].eq(1.0).all() and turns.buffers[0][6:].eq(0.0).all()
    with pytest.raises(RuntimeError, match=r"\(4, 4\) does not fit a staging buffer of 12"):
        turns.next_view((4, 4))


@pytest.mark.parametrize("rows, sources", [((0, 1, 2), (0, 1, 2)), ((2,), (0,)), ((0, 1), (1, 0))],
                         ids=["steady-batch", "one-pending-row", "reordered"])
def test_the_input_feed_writes_host_ids_and_feeds_pending_rows(rows, sources):
    """A steady batch (every row fed from the same row of the step before) is one device copy and
    leaves the staging buffers alone; any other feed stages the host ids and indexes the rest."""
    from harness.runtime.overlap import InputFeed, TokenFeed

    input_ids = torch.full((8,), -1, dtype=torch.int64)
    feed = InputFeed(input_ids, max_batch_size=4)
    previous_tokens = torch.tensor([70, 71, 72, 73])
    feed.feed = TokenFeed(previous_tokens, rows, sources)
    feed.write(input_ids, [5, 6, 7])
    expected = [5, 6, 7]
    for row, source in zip(rows, sources):
        expected[row] = int(previous_tokens[source])
    assert input_ids[:3].tolist() == expected and input_ids[3:].eq(-1).all()
    staged = any(buffer.any() for buffer in feed.staging.buffers)
    assert staged == (rows != (0, 1, 2)), "the steady batch staged host ids it does not need"
