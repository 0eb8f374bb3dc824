"""Kernels per decode step: a CPU proxy from the ops the emulator records, and on CUDA the kernels
a replay launches (torch.profiler).

The proxy is per layer and marginal: the ops of a decode step of a 4-layer model minus those of a
2-layer one, halved, so the per-forward ops (embedding, rotary rows, the context plan, the final
norm, lm_head, the ranking) are counted apart (`fixed`). Two counts:

- `recorded`: the calls an emulated capture of the step records (`EmulatedGraph.num_ops`): a
  custom op such as `harness::paged_attention` is one call there;
- `aten`: the non-view aten ops of the same step run eagerly, with each `harness::` custom op
  counted as the aten ops its body runs, which is what a CUDA replay launches kernels for -- except
  that on a CPU torch decomposes some ops (`rms_norm`: eight ops) that CUDA runs as one kernel.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

import torch

from harness.torch_internals import TorchDispatchMode
from harness.graphs import get_backend
from harness.graphs.emulator import opinfo
from harness.model import ReferenceLlama, random_llama, tiny_llama_config
from harness.ops.attention import paged_attention_impl
from harness.ops.metadata import SequenceSpan
from harness.ops.sparse_attention import block_sparse_attention_impl
from harness.runtime import Engine, EngineConfig

PROXY_LAYERS = (2, 4)
CONTEXT = 64
NO_KERNEL = {"empty.memory_format", "empty_strided.default", "empty.default", "empty_like.default"}
CUSTOM_BODIES: dict[str, Callable[..., object]] = {
    "harness::paged_attention": paged_attention_impl,
    "harness::block_sparse_attention": block_sparse_attention_impl,
}


class AtenOpCounter(TorchDispatchMode):
    """Counts the non-view aten ops that run under it, a custom op's body op by op."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        body = CUSTOM_BODIES.get(func._schema.name)
        if body is not None:
            with self:
                return body(*args, **kwargs)
        name = f"{func.overloadpacket.__name__}.{func._overloadname}"
        if name not in NO_KERNEL and opinfo.op_kind(func) is not opinfo.OpKind.VIEW:
            self.ops.append(name)
        return func(*args, **kwargs)


@dataclass(frozen=True)
class OpCounts:
    batch: int
    recorded_per_layer: float
    recorded_fixed: float
    aten_per_layer: float
    aten_fixed: float


def _decode_engine(layers: int, batch: int, backend) -> tuple[Engine, tuple[SequenceSpan, ...]]:
    model = ReferenceLlama.from_hf(random_llama(tiny_llama_config(num_hidden_layers=layers), seed=0))
    config = EngineConfig(max_batch_size=batch, max_num_tokens=2 * batch, block_size=16,
                          max_model_len=2 * CONTEXT, decode_graph_sizes=(batch,), graph_top_k=(1,))
    engine = Engine(model, config, backend=backend)
    engine.prepare_graphs()
    cache = engine.kv_cache
    spans = tuple(SequenceSpan(seq_len=CONTEXT, query_len=1,
                               block_table=tuple(cache.allocator.allocate(cache.blocks_for(CONTEXT))))
                  for _ in range(batch))
    return engine, spans


def _counts(layers: int, batch: int) -> tuple[int, int]:
    engine, spans = _decode_engine(layers, batch, get_backend("emulated", "cpu"))
    graphs = engine.decode_graphs
    key = graphs.graph_key(batch, 1)
    recorded = graphs.runner._entries[key].graph.num_ops
    engine.prepare_padded(spans, input_ids=tuple(range(1, batch + 1)))
    counter = AtenOpCounter()
    with torch.inference_mode(), counter:
        graphs._captured_step(1)()
    return recorded, len(counter.ops)


def op_counts(batch: int = 1) -> OpCounts:
    """The CPU proxy for a decode step of the tiny model's shape at `batch` (graph-ranked top-1)."""
    (rec_a, aten_a), (rec_b, aten_b) = (_counts(n, batch) for n in PROXY_LAYERS)
    span = PROXY_LAYERS[1] - PROXY_LAYERS[0]
    rec_layer, aten_layer = (rec_b - rec_a) / span, (aten_b - aten_a) / span
    return OpCounts(batch, rec_layer, rec_a - PROXY_LAYERS[0] * rec_layer,
                    aten_layer, aten_a - PROXY_LAYERS[0] * aten_layer)


def _device_events(replay: Callable[[], object], iters: int, *, sync_each: bool) -> list:
    """The CUDA events of `iters` replays under torch.profiler, after one unprofiled replay;
    `sync_each`: wait for each replay before the next is launched."""
    replay()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(iters):
            replay()
            if sync_each:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
    return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def cuda_kernels_per_replay(replay: Callable[[], object], *, iters: int = 5) -> float:
    """CUDA kernels a replay launches, by torch.profiler (memcpy and memset not counted)."""
    kernels = [e for e in _device_events(replay, iters, sync_each=False)
               if "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    return len(kernels) / iters


def render_op_counts(counts: list[OpCounts]) -> str:
    lines = ["Decode step ops per layer (CPU proxy, tiny shape, 4 layers minus 2, graph-ranked top-1; "
             "target <= 20 kernels per layer on CUDA):", "",
             "| batch | recorded ops per layer | fixed | aten ops per layer | fixed |",
             "|---:|---:|---:|---:|---:|"]
    lines += [f"| {c.batch} | {c.recorded_per_layer:g} | {c.recorded_fixed:g} | {c.aten_per_layer:g} | "
              f"{c.aten_fixed:g} |" for c in counts]
    return "\n".join(lines)


@dataclass(frozen=True)
class KernelRow:
    name: str
    calls: float  # per replay
    device_us: float  # summed kernel time per replay


@dataclass(frozen=True)
class ReplayDeviceProfile:
    """Where one replay's device time goes: kernels by total time, and the replay's span on the
    device (first kernel's start to last kernel's end) against the time some kernel was running.
    With PDL a kernel starts while its predecessor drains, so the summed kernel time can exceed
    the busy time; the span minus the busy time is the device idle between kernels."""

    rows: tuple[KernelRow, ...]
    kernels: float
    span_us: float
    busy_us: float
    summed_us: float

    @property
    def idle_us(self) -> float:
        return self.span_us - self.busy_us


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """The time at least one of the intervals covers (overlaps counted once)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def replay_device_profile(replay: Callable[[], object], *, iters: int = 20) -> ReplayDeviceProfile:
    """The device side of `iters` replays under torch.profiler, per replay (medians of span and busy
    time; memcpy and memset counted as kernels here, since they take device time too)."""
    events = sorted(_device_events(replay, iters, sync_each=True), key=lambda e: e.time_range.start)
    if not events or len(events) % iters:
        raise RuntimeError(f"replay_device_profile: {len(events)} device events over {iters} replays; "
                           "expected the same kernels in every replay")
    per = len(events) // iters
    spans, busy = [], []
    for i in range(iters):
        chunk = events[i * per:(i + 1) * per]
        intervals = [(e.time_range.start, e.time_range.end) for e in chunk]
        spans.append(max(b for _, b in intervals) - min(a for a, _ in intervals))
        busy.append(busy_time(intervals))
    totals: dict[str, list[float]] = {}
    for e in events:
        name = e.name if len(e.name) <= 70 else e.name[:67] + "..."
        totals.setdefault(name, []).append(e.time_range.end - e.time_range.start)
    rows = sorted((KernelRow(n, len(d) / iters, sum(d) / iters) for n, d in totals.items()),
                  key=lambda r: -r.device_us)
    return ReplayDeviceProfile(tuple(rows), float(per), statistics.median_high(spans),
                               statistics.median_high(busy), sum(r.device_us for r in rows))


def render_device_profile(p: ReplayDeviceProfile, *, limit: int = 25) -> str:
    lines = [f"One replay on the device (torch.profiler, per replay): {p.kernels:g} kernels, span "
             f"{p.span_us:.1f} us, busy {p.busy_us:.1f} us, idle between kernels {p.idle_us:.1f} us, "
             f"summed kernel time {p.summed_us:.1f} us", "",
             "| kernel | calls | us | share of summed |", "|---|---:|---:|---:|"]
    lines += [f"| `{r.name}` | {r.calls:g} | {r.device_us:.1f} | {r.device_us / p.summed_us:.0%} |"
              for r in p.rows[:limit]]
    rest = p.rows[limit:]
    if rest:
        lines.append(f"| {len(rest)} others | {sum(r.calls for r in rest):g} | "
                     f"{sum(r.device_us for r in rest):.1f} | "
                     f"{sum(r.device_us for r in rest) / p.summed_us:.0%} |")
    return "\n".join(lines)
