"""The device events of a profile taken on the emulated device, made from what the profiler recorded
on the host: the brackets kernel_log.py put around the device's launches, and the torch ops run
inside them.

- A bracket of device ops: each innermost op run inside that launches a kernel on CUDA (not a view
  or a metadata-only op) is one kernel, on the bracket's stream, timed as its CPU kernel ran;
  `cudaLaunchKernel` is recorded in the op (no duration: the emulated launch costs nothing).
- A copy between host and device: one memcpy named as CUPTI names it, with `cudaMemcpyAsync`.
- A graph replay: the bracket is `cudaGraphLaunch`; each recorded node is one kernel, and what
  ran inside the node (the CPU ops that replay it) is dropped: a replay runs no CPU op on CUDA.

`Plan` is computed once from the profiler's FunctionEvents and applied both to them (events(),
key_averages()) and to the exported Chrome trace. Kernel names cannot be CUDA's (the emulated
device has no CUDA kernels): a kernel is named after the op that ran it, `aten::mm (emulated
kernel)`.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import json
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.profiler_util import FunctionEvent

from harness.emulation.kernel_log import GRAPH, KERNELS, MARK, MEMCPY, NODE, Launch

_CPU = torch.autograd.DeviceType.CPU
_CUDA = torch.autograd.DeviceType.CUDA
KERNEL_SUFFIX = " (emulated kernel)"
GRAPH_LAUNCH = "cudaGraphLaunch"
# Ops that only make, describe or re-describe memory: no kernel on CUDA.
NO_KERNEL = frozenset({
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
    "aten::new_empty_strided", "aten::resize_", "aten::set_", "aten::_unsafe_view",
    "aten::_reshape_alias", "aten::record_stream", "aten::result_type", "aten::is_same_size",
    "aten::_has_compatible_shallow_copy_type", "aten::is_nonzero", "aten::item", "aten::size",
    "aten::stride", "aten::numel", "aten::dim", "aten::is_pinned", "aten::lift_fresh",
})


@dataclass(frozen=True)
class DeviceEvent:
    """One kernel or memcpy, and the CPU event that launched it (0: none recorded)."""

    name: str
    kind: str  # "kernel" | "memcpy"
    stream: int
    device: int
    start_us: float
    end_us: float
    launcher: int  # the FunctionEvent id of the launching op
    runtime: str  # the runtime call recorded in the launcher ("" for a graph's kernels)
    correlation: int


@dataclass(frozen=True)
class Plan:
    device_events: tuple[DeviceEvent, ...]
    dropped: frozenset[int]  # FunctionEvent ids: the brackets and what replays ran inside
    graph_launches: frozenset[int]  # brackets renamed cudaGraphLaunch


def _bracket_index(name: str) -> int | None:
    if not name.startswith(MARK):
        return None
    try:
        return int(name[len(MARK):])
    except ValueError:
        return None


# Copies a CPU kernel makes inside another op (a wrapped scalar cast to the op's dtype, addmm's
# bias copied into its output): CUDA's kernel does that work itself, with no kernel of its own.
INNER_CONVERSIONS = frozenset({"aten::to", "aten::_to_copy", "aten::copy_"})

def _is_view(name: str, overload: str) -> bool:
    """Whether the op returns only aliases of its inputs (every overload, where the profiler
    did not name one)."""
    namespace, _, op = name.partition("::")
    try:
        packet = getattr(getattr(torch.ops, namespace), op)
        names = [overload] if overload else packet.overloads()
        schemas = [getattr(packet, n)._schema for n in names]
    except (AttributeError, RuntimeError):
        return False
    return bool(schemas) and all(
        bool(schema.returns) and all(r.alias_info is not None and not r.alias_info.is_write
                                     for r in schema.returns) for schema in schemas)


def _launches_kernel(event: Any, cache: dict) -> bool:
    name = event.name
    if "::" not in name or name.startswith(MARK) or event.is_user_annotation \
            or getattr(event, "is_python_function", False) or name in NO_KERNEL:
        return False
    key = (name, event.overload_name or "")
    if key not in cache:
        cache[key] = not _is_view(*key)
    return cache[key]


def plan(events: list, launches: list[Launch], first_id: int) -> Plan:
    """The device events of `events` (FunctionEvents, before their tree is built), whose
    brackets index `launches`; new correlation ids count from `first_id`."""
    cpu = [e for e in events if e.device_type == _CPU and not e.is_async]
    parent: dict[int, Any] = {}
    for _, thread in itertools.groupby(sorted(cpu, key=lambda e: e.thread), key=lambda e: e.thread):
        stack: list = []
        for event in sorted(thread, key=lambda e: (e.time_range.start, -e.time_range.end)):
            while stack and (event.time_range.start >= stack[-1].time_range.end
                             or event.time_range.end > stack[-1].time_range.end):
                stack.pop()
            if stack:
                parent[id(event)] = stack[-1]
            stack.append(event)

    def bracket_of(event: Any) -> Any:
        up = parent.get(id(event))
        while up is not None and _bracket_index(up.name) is None:
            up = parent.get(id(up))
        return up

    def _below_kernel_op(event: Any, bracket: Any) -> bool:
        up = parent.get(id(event))
        while up is not None and up is not bracket:
            if _launches_kernel(up, cache):
                return True
            up = parent.get(id(up))
        return False

    def launch_of(event: Any) -> Launch | None:
        index = _bracket_index(event.name)
        return launches[index] if index is not None and index < len(launches) else None

    ids = itertools.count(first_id)
    cache: dict = {}
    dropped: set[int] = set()
    graphs: set[int] = set()
    members: dict[int, list] = {}  # bracket id(event) -> the candidate ops whose bracket it is
    node_ops: dict[int, list] = {}  # NODE bracket id(event) -> the events inside
    for event in cpu:
        launch = launch_of(event)
        if launch is not None:
            if launch.kind == GRAPH:
                graphs.add(event.id)
            else:
                dropped.add(event.id)
            continue
        bracket = bracket_of(event)
        if bracket is None:
            continue
        outer = bracket
        while outer is not None:  # anything inside a graph's node is the replay's, not the host's
            found = launch_of(outer)
            if found is not None and found.kind == NODE:
                node_ops.setdefault(id(outer), []).append(event)
                dropped.add(event.id)
                break
            outer = bracket_of(outer)
        else:
            if _launches_kernel(event, cache) and not (
                    event.name in INNER_CONVERSIONS and _below_kernel_op(event, bracket)):
                members.setdefault(id(bracket), []).append(event)

    out: list[DeviceEvent] = []
    for bracket in cpu:
        launch = launch_of(bracket)
        if launch is None or launch.kind == GRAPH:
            continue
        if launch.kind == NODE:
            inside = sorted(node_ops.get(id(bracket), ()), key=lambda e: e.time_range.start)
            ops = [e for e in inside if "::" in e.name]
            if not ops:
                continue  # nothing a GPU would run
            graph = bracket_of(bracket)
            launcher = parent.get(id(graph)) if graph is not None else None
            while launcher is not None and _bracket_index(launcher.name) is not None:
                launcher = parent.get(id(launcher))
            out.append(DeviceEvent(ops[0].name + KERNEL_SUFFIX, "kernel", launch.stream,
                                   launch.device, bracket.time_range.start, bracket.time_range.end,
                                   0 if launcher is None else launcher.id, "", next(ids)))
            continue
        candidates = members.get(id(bracket), [])
        inner = set()
        for c in candidates:  # an op with a kernel-launching op below it launches none itself
            up = parent.get(id(c))
            while up is not None and up is not bracket:
                inner.add(id(up))
                up = parent.get(id(up))
        leaves = [c for c in candidates if id(c) not in inner]
        if launch.kind == MEMCPY:
            if leaves:
                op = max(leaves, key=lambda e: e.time_range.end - e.time_range.start)
                out.append(DeviceEvent(launch.name, "memcpy", launch.stream, launch.device,
                                       op.time_range.start, op.time_range.end, op.id,
                                       "cudaMemcpyAsync", next(ids)))
            continue
        for op in leaves:
            out.append(DeviceEvent(op.name + KERNEL_SUFFIX, "kernel", launch.stream, launch.device,
                                   op.time_range.start, op.time_range.end, op.id,
                                   "cudaLaunchKernel", next(ids)))
    return Plan(tuple(out), frozenset(dropped), frozenset(graphs))


def apply_to_events(events: list, the_plan: Plan, use_device: str | None) -> list:
    """`events` with the plan's device events added and linked, its brackets dropped."""
    by_id = {e.id: e for e in events if e.device_type == _CPU}
    kept = [e for e in events if not (e.device_type == _CPU and e.id in the_plan.dropped)]
    for e in kept:
        if e.device_type == _CPU and e.id in the_plan.graph_launches:
            e.name = e.trace_name = GRAPH_LAUNCH
    for d in the_plan.device_events:
        launcher = by_id.get(d.launcher)
        kept.append(_function_event(
            id=d.correlation, name=d.name, trace_name=d.name, thread=d.stream,
            start_us=d.start_us, end_us=d.end_us, use_device=use_device, device_type=_CUDA,
            device_index=d.device, device_resource_id=d.stream, linked_correlation_id=d.launcher,
            stack=[], input_shapes=[]))
        if launcher is not None:
            launcher.append_kernel(d.name, d.device, d.end_us - d.start_us)
            if d.runtime:
                kept.append(_function_event(
                    id=d.correlation, name=d.runtime, trace_name=d.runtime,
                    thread=launcher.thread, start_us=launcher.time_range.start,
                    end_us=launcher.time_range.start, use_device=use_device,
                    linked_correlation_id=d.launcher, stack=[], input_shapes=[]))
    return kept


@functools.cache
def _function_event_parameters() -> frozenset[str]:
    return frozenset(inspect.signature(FunctionEvent.__init__).parameters)


def _function_event(**fields: Any) -> FunctionEvent:
    """A FunctionEvent of the fields this torch's takes: torch 2.11's has no
    `linked_correlation_id` (2.13's and 2.14's have), and a device event is one without it."""
    known = _function_event_parameters()
    return FunctionEvent(**{name: value for name, value in fields.items() if name in known})


def apply_to_trace(path: str, events: list, the_plan: Plan) -> None:
    """Rewrite the Chrome trace at `path` (what kineto saved) as `apply_to_events` does."""
    with open(path) as f:
        trace = json.load(f)
    entries = trace.get("traceEvents", [])
    by_id = {e.id: e for e in events if e.device_type == _CPU}
    found: dict[int, dict] = {}
    for entry in entries:
        corr = entry.get("args", {}).get("External id") if isinstance(entry.get("args"), dict) else None
        event = by_id.get(corr)
        if entry.get("ph") == "X" and event is not None and entry.get("name") in (
                event.trace_name, event.name):
            found[corr] = entry
    if not found:
        return
    offset = next(entry["ts"] - by_id[corr].time_range.start for corr, entry in found.items())
    kept = []
    for entry in entries:
        corr = entry.get("args", {}).get("External id") if isinstance(entry.get("args"), dict) else None
        if found.get(corr) is entry and corr in the_plan.dropped:
            continue
        if found.get(corr) is entry and corr in the_plan.graph_launches:
            entry["name"], entry["cat"] = GRAPH_LAUNCH, "cuda_runtime"
        kept.append(entry)
    tracks: set[tuple[int, int]] = set()
    for d in the_plan.device_events:
        tracks.add((d.device, d.stream))
        ts = d.start_us + offset
        launcher = found.get(d.launcher)
        args = {"External id": d.launcher, "device": d.device, "stream": d.stream,
                "correlation": d.correlation}
        kept.append({"ph": "X", "cat": d.kind if d.kind == "kernel" else "gpu_memcpy",
                     "name": d.name, "pid": d.device, "tid": d.stream, "ts": ts,
                     "dur": d.end_us - d.start_us, "args": args})
        if launcher is None or not d.runtime:
            continue
        kept.append({"ph": "X", "cat": "cuda_runtime", "name": d.runtime,
                     "pid": launcher["pid"], "tid": launcher["tid"], "ts": launcher["ts"],
                     "dur": 0, "args": {"External id": d.launcher, "correlation": d.correlation}})
        kept.append({"ph": "s", "id": d.correlation, "pid": launcher["pid"],
                     "tid": launcher["tid"], "ts": launcher["ts"], "cat": "ac2g", "name": "ac2g"})
        kept.append({"ph": "f", "id": d.correlation, "pid": d.device, "tid": d.stream, "ts": ts,
                     "cat": "ac2g", "name": "ac2g", "bp": "e"})
    for device in sorted({device for device, _ in tracks}):
        kept.append({"ph": "M", "name": "process_name", "pid": device, "tid": 0,
                     "args": {"name": "python"}})
        kept.append({"ph": "M", "name": "process_labels", "pid": device, "tid": 0,
                     "args": {"labels": f"GPU {device} (emulated)"}})
    for device, stream in sorted(tracks):
        kept.append({"ph": "M", "name": "thread_name", "pid": device, "tid": stream,
                     "args": {"name": f"stream {stream}"}})
    trace["traceEvents"] = kept
    with open(path, "w") as f:
        json.dump(trace, f)
