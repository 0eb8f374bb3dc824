"""Hypothesis strategies the suites share. Sizes are bounded so that a `ci` profile run stays fast."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from harness.records import EAGER, Generation, Step


@st.composite
def steps(draw, *, vocab: int = 64, top_k: int = 2, producers: tuple[str, ...] = (EAGER,)) -> Step:
    """One greedy step: the generated token is the best of `top_k` distinct tokens, logprobs best first."""
    tokens = draw(st.lists(st.integers(0, vocab - 1), min_size=top_k, max_size=top_k, unique=True))
    best = draw(st.floats(-12.0, 0.0, allow_nan=False))
    gaps = draw(st.lists(st.floats(0.0, 8.0, allow_nan=False), min_size=top_k - 1, max_size=top_k - 1))
    logprobs = [best]
    for gap in gaps:
        logprobs.append(logprobs[-1] - gap)
    return Step(token=tokens[0], logprob=best, top=tuple(zip(tokens, logprobs)),
                logit_scale=draw(st.floats(0.25, 64.0, allow_nan=False)), producer=draw(st.sampled_from(producers)))


def generations(*, max_requests: int = 4, max_steps: int = 6, **step_options) -> st.SearchStrategy[list[Generation]]:
    """A batch of generations, as one run of an engine would return them."""
    one = st.lists(steps(**step_options), max_size=max_steps).map(Generation.from_steps)
    return st.lists(one, max_size=max_requests)


# ----------------------------------------------------------------------------------------------
# Piecewise graphs: FX graph topologies, token buckets, engine workloads


@dataclass(frozen=True)
class FxNodeSpec:
    """One computing node: `op` (a STATIC_FX_OPS name or DYNAMIC_FX_OP) applied to earlier values
    (0 and 1 are the graph's two inputs, value 2 + i is node i's result)."""

    op: str
    inputs: tuple[int, ...]

    @property
    def dynamic(self) -> bool:
        return self.op == DYNAMIC_FX_OP


@dataclass(frozen=True)
class FxGraphSpec:
    nodes: tuple[FxNodeSpec, ...]

    @property
    def dynamic_positions(self) -> tuple[int, ...]:
        return tuple(i for i, n in enumerate(self.nodes) if n.dynamic)


# name -> arity; every op keeps the [tokens, FX_WIDTH] shape so any value can feed any node.
STATIC_FX_OPS = {"add": 2, "mul": 2, "relu": 1, "tanh": 1, "linear": 1, "scale": 1}
DYNAMIC_FX_OP = "dynamic"
FX_WIDTH = 4


def fx_graph_specs(*, max_nodes: int = 8, dags: bool = True) -> st.SearchStrategy[FxGraphSpec]:
    """Chains (each node reads the previous value) or DAGs (nodes read any earlier values), with
    dynamic ops anywhere: first, last, adjacent to each other, the only node, or absent."""

    @st.composite
    def build(draw) -> FxGraphSpec:
        layout = draw(st.sampled_from(["random", "first", "last", "adjacent", "only", "none"]))
        count = 1 if layout == "only" else draw(st.integers(1, max_nodes))
        if layout == "only":
            kinds = [True]
        elif layout == "none":
            kinds = [False] * count
        else:
            kinds = draw(st.lists(st.booleans(), min_size=count, max_size=count))
            if layout == "first":
                kinds[0] = True
            elif layout == "last":
                kinds[-1] = True
            elif layout == "adjacent":
                at = draw(st.integers(0, count - 1))
                kinds[at:at + 2] = [True, True]
        chain = not dags or draw(st.booleans())
        nodes = []
        for i, dynamic in enumerate(kinds):
            op = DYNAMIC_FX_OP if dynamic else draw(st.sampled_from(sorted(STATIC_FX_OPS)))
            arity = 1 if dynamic else STATIC_FX_OPS[op]
            available = i + 2
            if chain:
                inputs = tuple([available - 1] + [max(available - 2, 0)] * (arity - 1))
            else:
                inputs = tuple(draw(st.integers(0, available - 1)) for _ in range(arity))
            nodes.append(FxNodeSpec(op, inputs))
        return FxGraphSpec(tuple(nodes))

    return build()


def bucket_sets(*, max_bucket: int = 64, max_size: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    """Valid bucket sets (sorted, distinct, each >= 2)."""
    return st.lists(st.integers(2, max_bucket), min_size=1, max_size=max_size, unique=True).map(
        lambda values: tuple(sorted(values)))


def invalid_bucket_lists(max_num_tokens: int) -> st.SearchStrategy[tuple[list, object]]:
    """(bucket list, the first bad bucket in it): a list with at least one bucket that is not an
    integer, not positive, below the minimum of 2, or above `max_num_tokens`."""

    @st.composite
    def build(draw):
        good = st.integers(2, max_num_tokens)
        bad = st.one_of(st.integers(-5, 1), st.integers(max_num_tokens + 1, max_num_tokens + 100),
                        st.sampled_from([2.5, "8", None, True]))
        before = draw(st.lists(good, max_size=3))
        culprit = draw(bad)
        after = draw(st.lists(st.one_of(good, bad), max_size=3))
        return before + [culprit] + after, culprit

    return build()


@dataclass(frozen=True)
class Workload:
    """An engine run to compare in graph mode and eager: requests (prompt length, new tokens), the
    engine's batch limit (small limits make later admissions, i.e. mixed batches) and the
    piecewise buckets."""

    requests: tuple[tuple[int, int], ...]
    max_batch_size: int
    buckets: tuple[int, ...]
    seed: int = 0

    def make_requests(self, vocab_size: int = 512):
        import random

        from harness.records import Request

        rng = random.Random(self.seed)
        return [Request([rng.randrange(vocab_size) for _ in range(n)], m, logprobs=3)
                for n, m in self.requests]


def workloads(*, max_requests: int = 5, max_prompt: int = 40, max_new: int = 6,
              buckets: st.SearchStrategy[tuple[int, ...]] | None = None,
              max_batch_sizes: st.SearchStrategy[int] | None = None) -> st.SearchStrategy[Workload]:
    """Workloads whose batches land below, on and above the buckets (over-range batches run eagerly
    and are counted). `buckets` defaults to random sets up to 128 tokens, `max_batch_sizes` to 1..4
    (each distinct pair is an engine to compile: narrow them where examples must be cheap)."""
    request = st.tuples(st.integers(1, max_prompt), st.integers(1, max_new))
    return st.builds(Workload, requests=st.lists(request, min_size=1, max_size=max_requests).map(tuple),
                     max_batch_size=st.integers(1, 4) if max_batch_sizes is None else max_batch_sizes,
                     buckets=bucket_sets(max_bucket=128) if buckets is None else buckets, seed=st.integers(0, 3))
