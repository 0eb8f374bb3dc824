"""A MoE dispatch that forks onto its communication stream and hands back an event the caller
must wait on, whose caller never waits because nothing in the step reads the stream's result
(DeepEP #62, "Capture cuda graph failed: CUDA error: capturing stream has unjoined work":
https://github.com/deepseek-ai/DeepEP/issues/62; the same error when a sibling stream is not yet
joined, NVIDIA warp #1469: https://github.com/NVIDIA/warp/issues/1469). DeepEP's `async_finish`
pattern: the dispatch makes its stream wait on the caller's (a fork), works there, and records an
event the caller's `current_stream_wait()` joins back. Here the comm stream also counts the tokens
each expert received, a statistic the host reads after the step's `synchronize()`: eagerly nothing
needs the join and the step is right. In a capture the fork is never joined: CUDA ends it with
cudaErrorStreamCaptureUnjoined ("capturing stream has unjoined work", H100, torch 2.11) and no
graph is made; the harness raises the same, naming the error. Fixed: the caller joins the
handle's event before the captured step ends. A failed real capture leaves CUDA's process state
broken, so the refused capture runs in a process of its own natively."""

from __future__ import annotations

import re

import torch

from harness.emulation import emulation_active
from suites.cuda_device._own_process import in_a_process_of_its_own

EXPERTS, TOKENS = 4, 8
UNJOINED = "fork that was not joined|unjoined"


class Dispatch:
    """The comm library: work on its own stream, forked from the caller's, and an event for the join."""

    def __init__(self) -> None:
        self.comm = torch.cuda.Stream()
        self.load = torch.zeros(EXPERTS, device="cuda")  # tokens per expert, for the host's balancer

    def __call__(self, hidden: torch.Tensor,
                 expert_ids: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event]:
        caller = torch.cuda.current_stream()
        self.comm.wait_stream(caller)  # the fork: the comm stream starts after the caller's work
        with torch.cuda.stream(self.comm):
            received = hidden * 1.0  # the all-to-all, on one device
            self.load.index_add_(0, expert_ids, torch.ones_like(expert_ids, dtype=self.load.dtype))
            done = torch.cuda.Event()
            done.record(self.comm)
        received.record_stream(caller)
        return received, done


class Layer:
    def __init__(self, *, waits_on_the_handle: bool) -> None:
        self.waits = waits_on_the_handle
        self.dispatch = Dispatch()
        self.hidden = torch.arange(float(TOKENS), device="cuda")
        self.expert_ids = torch.arange(TOKENS, device="cuda") % EXPERTS
        self.out = torch.zeros(TOKENS, device="cuda")

    def step(self) -> None:
        received, done = self.dispatch(self.hidden, self.expert_ids)
        # The combine reads `received` on the comm stream's behalf (the library's own combine
        # kernel runs there), so the caller sees no reason to wait.
        with torch.cuda.stream(self.dispatch.comm):
            torch.mul(received, 2, out=self.out)
            done.record(self.dispatch.comm)
        if self.waits:
            torch.cuda.current_stream().wait_event(done)  # EventOverlap.current_stream_wait()

    def capture(self) -> torch.cuda.CUDAGraph:
        self.step()  # warmup, eagerly
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        caller = torch.cuda.current_stream()
        try:
            with torch.cuda.graph(graph):
                self.step()
        finally:
            # torch.cuda.graph leaves its capture stream current when capture_end raises
            torch.cuda.set_stream(caller)
        return graph


def test_the_eager_step_needs_no_join():
    layer = Layer(waits_on_the_handle=False)
    layer.step()
    torch.cuda.synchronize()
    assert layer.out.tolist() == [2.0 * i for i in range(TOKENS)]
    assert layer.dispatch.load.tolist() == [2.0] * EXPERTS


def _capture_never_joined() -> str:
    """What capturing the step whose dispatch is never joined raised, as text."""
    try:
        Layer(waits_on_the_handle=False).capture()
    except RuntimeError as error:
        return str(error)
    return ""


def test_a_capture_with_the_dispatch_never_joined_is_refused():
    if emulation_active() is None:
        raised = in_a_process_of_its_own(__file__, "_capture_never_joined")
    else:
        raised = _capture_never_joined()
    assert re.search(UNJOINED, raised), raised


def test_joining_the_handle_captures_a_graph_that_replays_the_dispatch():
    layer = Layer(waits_on_the_handle=True)
    graph = layer.capture()
    layer.hidden.copy_(torch.arange(float(TOKENS), device="cuda") + 1)
    layer.dispatch.load.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert layer.out.tolist() == [2.0 * (i + 1) for i in range(TOKENS)]
    assert layer.dispatch.load.tolist() == [2.0] * EXPERTS
