"""Hypothesis strategies the suites share. Sizes are bounded so that a `ci` profile run stays fast."""

from __future__ import annotations

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
