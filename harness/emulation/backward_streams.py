"""The autograd engine's stream checks across a CUDA graph capture boundary (torch 2.14 and later).

On CUDA every autograd node keeps the stream that was current when it was made, and the engine
syncs streams by it: a node's consumer waits for its producer's stream (InputBuffer::add), and at
the end of `backward()` the caller's current stream waits for the stream of each leaf the pass ran
(an AccumulateGrad node). An AccumulateGrad node outlives the pass that made it while anything
holds the graph (a `loss` kept from warmup, DDP's stashed accumulators). Torch 2.14 raises where
such a node's stream is across the capture boundary from the stream meeting it:

- a defined gradient from a capturing producer reaches a leaf whose stream is the default stream
  (not capturing): "During CUDA graph capture, autograd node '...' has a stale reference to the
  default stream (stream 0) from warmup. ..." (torch/csrc/autograd/input_buffer.cpp), raised
  while the pass runs;
- at the end of the pass, a leaf's stream and the caller's current stream are one capturing, the
  other not: "During CUDA graph capture, autograd tried to synchronize streams across the capture
  boundary (leaf stream N on device D is capturing but the caller's stream is not) ..."
  (GraphTask::exec_post_processing, engine.cpp; "is not capturing but the caller's stream is" the
  other way round).

`torch.autograd.graph.set_override_stale_capture_stream(True)` makes the first case take the
producer's capturing stream for the leaf (any stale stream, default or not) and the second skip
the sync with a warning. Builds without that function make neither check, and neither does this
module there.

The emulated device runs the engine on the host, where nodes keep no stream: `stamp(out, stream)`
(called by the placement mode after each call that returns a tensor with history) writes the
current stream into the metadata of each node it has not seen (the output's own node and, through
`next_functions`, the nodes made without a call it saw: an autograd.Function's, and the leaves'),
and `StaleStreamChecks` makes the two checks around an engine run that meets a capture in progress.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

from harness import torch_internals
from harness.emulation.device_memory import is_device_memory

# The node metadata key of the stream current when the node was first seen.
STREAM_KEY = "harness_emulated_stream"

# torch.autograd.graph.set_override_stale_capture_stream's flag, where this build has it.
_OVERRIDE_FLAG = torch_internals.optional_name("override_stale_capture_stream")
CHECKED = _OVERRIDE_FLAG is not None and hasattr(torch.autograd.graph,
                                                 "set_override_stale_capture_stream")

_STALE_DEFAULT = (
    "During CUDA graph capture, autograd node '{}' has a stale reference to the default stream "
    "(stream 0) from warmup. This will invalidate the capture because cudaStreamWaitEvent on the "
    "default stream pulls a non-capturing stream into the graph.\n\nTo fix, either:\n"
    "  (a) Run warmup on the same stream that capture will use, or\n"
    "  (b) Delete references to the loss / autograd graph (e.g. `del loss`) before capture, or\n"
    "  (c) Call torch.autograd.graph.set_override_stale_capture_stream(True) to automatically "
    "redirect stale nodes to the capturing stream.")
_ACROSS_BOUNDARY = (
    "During CUDA graph capture, autograd tried to synchronize streams across the capture boundary "
    "(leaf stream {} on device {}{}), which would invalidate the capture. A common cause is an "
    "autograd leaf from warmup holding a stale stream. Either run warmup on the capture stream, "
    "delete references to the autograd graph (e.g. `del loss`) before capture, call backward() "
    "with the capturing stream current, or call "
    "torch.autograd.graph.set_override_stale_capture_stream(True).")
_LEAF_CAPTURING = " is capturing but the caller's stream is not"
_CALLER_CAPTURING = " is not capturing but the caller's stream is"
_SKIPPED = ("Skipping the end-of-backward sync between a leaf stream and the caller's current "
            "stream because exactly one of them is capturing a CUDA graph (see "
            "torch.autograd.graph.set_override_stale_capture_stream).")


def stamp(out: Any, current_stream: Callable[[], Any]) -> None:
    """Note the current stream (`current_stream()`, asked only when there is a node to note) as
    the stream of the node of `out` (a call's result) and of every node behind it not noted yet,
    stopping at noted nodes and at leaves."""
    tensor = out if isinstance(out, torch.Tensor) else (
        next((t for t in out if isinstance(t, torch.Tensor)), None)
        if isinstance(out, (tuple, list)) else None)
    node = None if tensor is None else tensor.grad_fn
    if node is None or STREAM_KEY in node.metadata:
        return
    stream = current_stream()
    node.metadata[STREAM_KEY] = stream
    pending = [node]
    while pending:
        for following, _ in pending.pop().next_functions:
            if following is None:
                continue
            metadata = following.metadata
            if STREAM_KEY in metadata:
                continue
            metadata[STREAM_KEY] = stream
            if not _is_leaf_node(following):
                pending.append(following)


def _is_leaf_node(node: Any) -> bool:
    return hasattr(node, "variable")  # AccumulateGrad: the leaf it accumulates into


def _root_node(root: Any) -> Any:
    """The node a pass starts from for one of its roots (a tensor or a GradientEdge)."""
    if not isinstance(root, torch.Tensor):
        return getattr(root, "node", None)
    if root.grad_fn is None and root.requires_grad:
        return torch.autograd.graph.get_gradient_edge(root).node
    return root.grad_fn


def _stream_of(node: Any) -> Any:
    return node.metadata.get(STREAM_KEY)


class StaleStreamChecks:
    """Both checks for one engine run (`backward()`, `autograd.grad()`) while a capture is in
    progress: `before(roots)` hooks each device leaf the pass may run, `after()` makes the
    end-of-pass check of the leaves that ran. A pass that raised makes no end-of-pass check."""

    def __init__(self, state) -> None:
        self._state = state
        self._caller = state.streams.current()
        self._handles: list = []
        self._leaf_streams: list = []  # the streams of the leaves that ran, in order

    def before(self, roots) -> None:
        producers: dict[int, list] = {}  # id(leaf node) -> the streams of the nodes feeding it
        leaves: dict[int, Any] = {}
        seen: set[int] = set()
        pending = []
        for node in filter(None, map(_root_node, roots)):
            if _is_leaf_node(node):  # backward() of a leaf: its own AccumulateGrad runs
                leaves[id(node)] = node
                producers.setdefault(id(node), [])
            elif id(node) not in seen:
                seen.add(id(node))
                pending.append(node)
        while pending:
            node = pending.pop()
            for following, _ in node.next_functions:
                if following is None:
                    continue
                if _is_leaf_node(following):
                    leaves[id(following)] = following
                    producers.setdefault(id(following), []).append(_stream_of(node))
                elif id(following) not in seen:
                    seen.add(id(following))
                    pending.append(following)
        for key, leaf in leaves.items():
            variable = leaf.variable
            if _stream_of(leaf) is None or not is_device_memory(variable):
                continue
            self._handles.append(leaf.register_prehook(self._leaf_hook(leaf, producers[key])))

    def _leaf_hook(self, leaf: Any, producer_streams: list):
        state = self._state
        node_stream = _stream_of(leaf)

        def check(grad_outputs):
            stream = node_stream
            if grad_outputs and grad_outputs[0] is not None and \
                    not state.stream_captures(stream):
                # InputBuffer::add: a gradient from a capturing producer meets a stale leaf
                capturing = next((s for s in producer_streams
                                  if s is not None and state.stream_captures(s)), None)
                if capturing is not None:
                    if _OVERRIDE_FLAG():
                        stream = capturing
                    elif stream.stream_id == 0:
                        raise RuntimeError(_STALE_DEFAULT.format(leaf.name()))
            self._leaf_streams.append(stream)
            return None

        return check

    def after(self) -> None:
        """The end of a pass that ran: the caller's stream meets each leaf's (exec_post_processing)."""
        state = self._state
        caller = self._caller
        done: list = []
        for stream in self._leaf_streams:
            if stream == caller or stream in done:
                continue
            done.append(stream)
            leaf_capturing = state.stream_captures(stream)
            if leaf_capturing == state.stream_captures(caller):
                continue
            if _OVERRIDE_FLAG():
                if not state.warned_stale_capture_sync:
                    state.warned_stale_capture_sync = True
                    warnings.warn(_SKIPPED, UserWarning, stacklevel=2)
                continue
            raise RuntimeError(_ACROSS_BOUNDARY.format(
                stream.stream_id, stream.device_index,
                _LEAF_CAPTURING if leaf_capturing else _CALLER_CAPTURING))

    def remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
