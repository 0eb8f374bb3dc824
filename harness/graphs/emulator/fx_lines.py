"""The source line behind a frame of FX's generated code.

A `torch.fx.GraphModule` runs code that FX generated (`<eval_with_key>.N`): a line of it is one
node, not the model's source. Dynamo traces each node with the stack of the model code that made it
(`node.meta["stack_trace"]`), so an op issued from generated code can be named by the model's own
file and line. Where the node has no stack trace (a graph traced without one, a node a pass added),
the generated frame stays, and `describe` says so.
"""

from __future__ import annotations

import re
from types import FrameType

import torch.fx

GENERATED_PREFIX = "<eval_with_key>"
NO_STACK_TRACE = "FX-generated code: its node has no stack trace"
_FILE_LINE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)', re.MULTILINE)


def is_generated(filename: str) -> bool:
    return filename.startswith(GENERATED_PREFIX)


def node_of(frame: FrameType) -> torch.fx.Node | None:
    """The node of the GraphModule whose generated `forward` the frame is executing, or None."""
    module = frame.f_locals.get("self")
    if not isinstance(module, torch.fx.GraphModule) or module.forward.__code__ is not frame.f_code:
        return None
    # Generated line -> node index, kept by GraphModule.recompile() (dynamo reads it the same way
    # when it retraces a GraphModule); a torch without it names the generated line.
    lines = getattr(module, "_lineno_map", None)
    if not lines:
        return None
    index = lines.get(frame.f_lineno - frame.f_code.co_firstlineno)
    if index is None:
        return None
    nodes = module.graph.nodes
    return next((n for i, n in enumerate(nodes) if i == index), None)


def source_frames(frame: FrameType) -> tuple[tuple[str, int], ...]:
    """The model frames (innermost first) a generated frame stands for: its node's stack trace, or
    () where the node has none."""
    node = node_of(frame)
    trace = None if node is None else node.meta.get("stack_trace")
    if not trace:
        return ()
    found = [(m["file"], int(m["line"])) for m in _FILE_LINE.finditer(trace)]
    return tuple(reversed(found))


def describe(filename: str, described: str) -> str:
    """`described` (a generated frame's `file:line: source`) with the note that no model line is known."""
    return f"{described} ({NO_STACK_TRACE})" if is_generated(filename) else described
