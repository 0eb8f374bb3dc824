"""Replay on the emulated CUDA device with stream tracking against without (target: at most
1.1x): the hand-written decode step captured through torch.cuda.graph and replayed, each replay
followed by torch.cuda.synchronize(). Both run in one emulation, taking turns within every
iteration (so load on a shared machine falls on both alike); the untracked turn detaches the
tracking observer and its dispatch mode for the duration."""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from harness.torch_internals import disable_current_modes

TRACKING_TARGET = 1.1


@dataclass(frozen=True)
class TrackingTiming:
    untracked_ms: float
    tracked_ms: float

    @property
    def ratio(self) -> float:
        return self.tracked_ms / self.untracked_ms


@contextlib.contextmanager
def _untracked(state) -> Iterator[None]:
    observers, state.observers = state.observers, []
    try:
        with disable_current_modes():
            yield
    finally:
        state.observers = observers


def measure_tracking(median_ms: Callable[..., list[float]], *, batch: int, iters: int,
                     warmup: int) -> TrackingTiming:
    import harness
    from harness.bench._tiny_decoder import TinyDecoder, TinyDecoderConfig

    with harness.emulate_cuda(device="cpu", races="strict") as state, torch.inference_mode(), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = TinyDecoderConfig(batch=batch)
        decoder = TinyDecoder(config, seed=0, device="cuda")
        decoder.tokens.copy_(torch.arange(batch) * 7 % config.vocab)
        decoder.positions.copy_(torch.arange(batch) % config.max_seq)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            decoder.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            decoder.step()

        def tracked() -> None:
            graph.replay()
            torch.cuda.synchronize()

        def untracked() -> None:
            with _untracked(state):
                graph.replay()
                torch.cuda.synchronize()

        untracked_ms, tracked_ms = median_ms(untracked, tracked, iters=iters, warmup=warmup)
    return TrackingTiming(untracked_ms, tracked_ms)


def render_tracking(timing: TrackingTiming, *, batch: int, iters: int) -> str:
    return "\n".join([
        f"Replay on the emulated CUDA device, stream tracking on vs off, hand-written decode step, "
        f"batch {batch}, median of {iters} iterations (target ratio <= {TRACKING_TARGET:.2f})", "",
        "| untracked ms | tracked ms | tracked/untracked |", "|---:|---:|---:|",
        f"| {timing.untracked_ms:.3f} | {timing.tracked_ms:.3f} | {timing.ratio:.2f}x |"])
