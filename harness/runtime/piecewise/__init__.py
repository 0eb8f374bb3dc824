"""Piecewise graphs: the FX split at dynamic ops (`split.py`), one runner per static segment with
its token buckets (`runner.py`), the bucket ladder (`buckets.py`), the `torch.compile` backend that
splits and wraps (`compile_backend.py`), its pool factory and split predicate (`policy.py`), and
the reference model's compiled body (`model.py`)."""

from harness.runtime.piecewise.runner import MissingCaptureError, PiecewiseRunner, ReleasedPoolError, ReplayInputError
from harness.runtime.piecewise.split import SplitInfo, split_graph_at_dynamic_ops

__all__ = ["MissingCaptureError", "PiecewiseRunner", "ReleasedPoolError", "ReplayInputError", "SplitInfo",
           "split_graph_at_dynamic_ops"]
