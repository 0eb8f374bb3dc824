"""The choices of the piecewise compile backend, as one frozen object.

`Engine(model, config, piecewise_policy=...)` hands it to `PiecewiseGraphs`, which gives its parts
to the `PiecewiseCompileBackend` (`pools=`, `split_at=`); without one the engine asks
`default_piecewise_policy()`. A runtime with other rules (or the fault zoo, planting a known bug)
passes other parts.

- `pools` (`PoolFactory`): where a pool group gets its pool, at its first compile and after every
  `clear_piecewise_graphs()`; the reference asks the graph backend for a new handle every time, so a
  recapture never records into a released pool.
- `split_at` (`SplitPredicate`): which FX nodes are dynamic, i.e. run eagerly between the static
  pieces: calls of the ops in `DYNAMIC_OPS`, however dynamo spelled the target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import fx

from harness.graphs.base import GraphBackend
from harness.runtime.piecewise.split import node_calls_ops

# The ops whose work depends on the host-side batch layout, and the fused rope + KV write, which
# writes the KV cache (a piece's input, which compiled pieces may not write): they run eagerly
# between the pieces.
DYNAMIC_OPS = frozenset({"harness::paged_attention", "harness::paged_decode_attention",
                         "harness::block_sparse_attention", "harness::rope_kv_write"})


@dataclass(frozen=True)
class PoolFactory:
    """A new pool handle from the graph backend for every request."""

    def new_pool(self, graph_backend: GraphBackend) -> Any:
        return graph_backend.graph_pool_handle()


@dataclass(frozen=True)
class SplitPredicate:
    """True for a node that calls one of `ops` (op names "namespace::name")."""

    ops: frozenset[str] = DYNAMIC_OPS

    def __call__(self, node: fx.Node) -> bool:
        return node_calls_ops(node, self.ops)


@dataclass(frozen=True)
class PiecewisePolicy:
    pools: PoolFactory = PoolFactory()
    split_at: SplitPredicate = SplitPredicate()


def default_piecewise_policy() -> PiecewisePolicy:
    """The policy of an engine built without one."""
    return PiecewisePolicy()
