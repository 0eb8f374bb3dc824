"""Conditional nodes in a recording: CUDA 12.4's if and while graph nodes, as torch captures them
(`CUDAGraph.begin_capture_to_if_node` / `begin_capture_to_while_node`,
`end_capture_to_conditional_node`, `set_conditional_handle_for_current_node`; torch.cond and
torch.while_loop under cudagraph trees).

CUDA's graph holds a conditional handle and a node whose body is a child graph. torch captures,
in stream order before the node, a one-thread kernel that copies the predicate's first byte into
the handle (`cudaGraphSetConditional(handle, *pred)`), and the body's ops into the child graph; at
each replay the node runs its body when the handle is nonzero (an if node), or as long as it is
(a while node, whose body ends with another such kernel: `set_conditional_handle_for_current_node`).
So the predicate is read on the device at replay, where that kernel sits, never at capture.

A recording does the same with two kinds of step: `set_handle` reads the predicate's replay alias
into a `ConditionHandle`, and the node's step runs the body's steps (cut out of the recording when
the body ends) under that handle. A while node whose predicate never turns false loops forever,
as CUDA's does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.graphs.emulator.opinfo import ReplayStep


@dataclass(eq=False)
class ConditionHandle:
    """CUDA's cudaGraphConditionalHandle: the value the last set-handle step of a replay stored."""

    value: bool = False


@dataclass(eq=False)
class OpenConditional:
    """A conditional node whose body is being captured: its steps start at `start` of the
    recording. `drew`: a random op of the body drew from a generator (CUDA refuses that when the
    body ends)."""

    handle: ConditionHandle
    loops: bool
    start: int
    drew: bool = field(default=False)


def set_handle(handle: ConditionHandle, pred: torch.Tensor) -> None:
    """torch's set_conditional_handle_kernel: the predicate's first element, as a bool."""
    handle.value = bool(pred.reshape(-1)[0])


def run_if_node(handle: ConditionHandle, body: tuple[ReplayStep, ...]) -> None:
    if handle.value:
        for fn, args, kwargs in body:
            fn(*args, **kwargs)


def run_while_node(handle: ConditionHandle, body: tuple[ReplayStep, ...]) -> None:
    while handle.value:
        for fn, args, kwargs in body:
            fn(*args, **kwargs)


def node_step(node: OpenConditional, body: list[ReplayStep]) -> ReplayStep:
    """The step that replays `node` with the body steps recorded since it began."""
    return (run_while_node if node.loops else run_if_node, (node.handle, tuple(body)), {})
