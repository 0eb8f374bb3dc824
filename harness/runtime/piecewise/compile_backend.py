"""A `torch.compile` backend that splits the traced graph at the attention ops and wraps each static
piece in a `PiecewiseRunner`. No inductor and no C compiler: the pieces run as FX code, eagerly in
warmup and as recorded graphs after capture.

The backend owns what all its runners share: the `CaptureControl` (phase and token bucket), the pool
groups (one per compiled graph, its runners capture into one pool), and the pools released so far.
`clear_piecewise_graphs()` resets every runner and gives each former pool group a fresh pool from its
`PoolFactory` (policy.py), so a recapture (phase 2, against the final KV cache) never records into a
released pool; the split predicate is the policy's too.

Every call of the backend is one compile; `compiles` counts them, so a caller can tell a
recompile while serving (dynamo's guards failed: a new graph without captures) from a replay.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import fx

from harness.graphs.base import GraphBackend
from harness.runtime.piecewise.policy import PoolFactory, SplitPredicate
from harness.runtime.piecewise.runner import CaptureControl, PiecewiseRunner, PoolGroup, is_weight
from harness.runtime.piecewise.split import SplitInfo, mutated_inputs, split_graph_at_dynamic_ops, submodule_name


class PiecewiseCompileBackend:
    """`torch.compile(fn, backend=PiecewiseCompileBackend(graph_backend))`.

    - `static_input(tensor)`: inputs that keep their address (weights, model buffers); the runners
      copy every other tensor input into static buffers.
    - `on_missing(reason)`: given to every runner; see `PiecewiseRunner`.
    - `pools` (a `PoolFactory`, policy.py): where every pool group gets its pool.
    - `split_at(node)`: the split predicate (default `SplitPredicate()`: the attention ops).
    - `compile_piece(module, name)`: what a runner runs for a static piece (None: its FX code);
      the compiled path passes inductor's (runtime/compiled/piece.py), as vLLM wraps each
      inductor-compiled piece in a graph of its own.
    """

    def __init__(self, graph_backend: GraphBackend, *,
                 static_input: Callable[[torch.Tensor], bool] = is_weight,
                 on_missing: Callable[[str], None] | None = None,
                 pools: PoolFactory = PoolFactory(),
                 split_at: Callable[[fx.Node], bool] = SplitPredicate(),
                 compile_piece: Callable[[fx.GraphModule, str], Callable[..., Any]] | None = None) -> None:
        self.graph_backend = graph_backend
        self.static_input = static_input
        self.on_missing = on_missing
        self.pools = pools
        self.split_at = split_at
        self.compile_piece = compile_piece
        self.control = CaptureControl()
        self.groups: list[PoolGroup] = []
        self.runners: list[PiecewiseRunner] = []
        self.splits: list[SplitInfo] = []
        self.released_pools: list[Any] = []
        self.compiles = 0

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        self.compiles += 1
        split = split_graph_at_dynamic_ops(gm, self.split_at)
        for index in split.static:
            written = mutated_inputs(split.submodule(index))
            if written:
                raise ValueError(f"static piece {submodule_name(index)} writes its inputs {written} in "
                                 f"place; a replay would write the runner's static copies instead. Move "
                                 f"the write into a dynamic op (a custom op with mutates_args)")
        group = PoolGroup(pool=self.pools.new_pool(self.graph_backend), released=self.released_pools)
        self.groups.append(group)
        for index in split.static:
            module = split.submodule(index)
            if self.compile_piece is not None:
                module = self.compile_piece(module, f"{submodule_name(index)} of graph {self.compiles}")
            runner = PiecewiseRunner(module, index=index, backend=self.graph_backend,
                                     control=self.control, group=group, static_input=self.static_input,
                                     on_missing=self.on_missing)
            # The split module's code calls self.submod_<i>(...); an instance attribute shadows the
            # registered submodule without nn.Module's child-module type check.
            split.split_module.__dict__[submodule_name(index)] = runner
            self.runners.append(runner)
        self.splits.append(split)
        return split.split_module

    @property
    def live_runners(self) -> list[PiecewiseRunner]:
        """The runners of the latest compiled graph (the one dynamo calls while its guards hold)."""
        if not self.splits:
            return []
        latest = self.groups[-1]
        return [r for r in self.runners if r.group is latest]

    def clear_piecewise_graphs(self) -> None:
        """Reset every runner (graphs, static buffers, warmup counts) and give each pool group a
        fresh pool; the released pools are remembered and refused by later captures."""
        for runner in self.runners:
            runner.reset()
        for group in self.groups:
            old = group.pool
            self.released_pools.append(old)
            group.pool = self.pools.new_pool(self.graph_backend)
            group.static_outputs.clear()
