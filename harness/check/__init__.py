"""What suites assert with: BF16-step comparison of generations, tensor pointer snapshots, the
capture lint, the explanation of a divergence op by op, and the count of graph replays."""

from harness.check.lint import LintReport, capture_lint
from harness.check.compare import Comparison, Divergence, compare_generations
from harness.check.explain import Explanation, explain_divergence
from harness.check.replays import ReplayCount, count_replays
from harness.check.tolerance import bf16_step, logprob_tolerance
from harness.graphs.pointers import TensorRecord, describe_moved, moved_tensors, snapshot_tensors
from harness.runtime.comm import (GraphDisagreementError, GraphKeyTimeoutError,
                                  agree_on_graph_key)

__all__ = [
    "Comparison", "Divergence", "ReplayCount", "count_replays", "GraphDisagreementError", "GraphKeyTimeoutError", "agree_on_graph_key", "Explanation", "LintReport", "capture_lint", "TensorRecord", "bf16_step", "compare_generations", "describe_moved",
    "explain_divergence", "logprob_tolerance", "moved_tensors", "snapshot_tensors",
]
