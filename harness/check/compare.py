"""Compare greedy generations of a candidate run (graphs) against a baseline run (eager).

The rule (docs/design.md, "Checks"), per request, step by step:

- Tokens must match until one flips. A flip is allowed only where the baseline's generated token and
  its runner-up by logprob are within the tolerance (a near tie), and only to a token of the
  baseline's top-k that is within the tolerance of the generated one: the runner-up, or a third token
  in a three-way tie (the rule names only the runner-up; bf16 logits over a 128k vocabulary tie three
  ways in practice). After an allowed flip the two continuations are different texts, so that request
  is compared no further.
- On every matched step the generated token's logprob agrees within `steps` bf16 steps at the
  baseline step's logit scale. The baseline's scale, not the larger of both: a broken candidate with
  exploding logits must not widen its own tolerance.
- Without an allowed flip, the two generations have the same length.
- Every compared step's top-k list has the baseline's length: the request asked for that many
  logprobs, and a runtime that returns fewer or more (a graph that ranked too few) is wrong.

Only the first divergence of each request is reported: after it, later steps compare a different
context and say nothing new. The comparison knows nothing of the engine; it reads plain records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.check.tolerance import bf16_step, logprob_tolerance
from harness.records import Generation, Step

TopK = tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class Divergence:
    """The first place where a candidate request left the baseline.

    `kind` is "token" (a flip the rule does not allow), "logprob" (drift beyond the tolerance),
    "length" (different lengths without a flip), "top" (a top-k list of another length than the
    baseline's) or "requests" (different numbers of requests; then
    `request` is the first index only one side has). `gap` is the logprob difference that was judged:
    baseline top-two gap for a flip, |candidate - baseline| for a drift. `producer` is what ran the
    candidate's step ("eager" or a graph key).
    """

    request: int
    step: int
    kind: str
    expected_top: TopK
    actual_top: TopK
    gap: float | None
    tolerance: float | None
    producer: str | None
    detail: str
    logit_scale: float | None = None

    def __str__(self) -> str:
        lines = [f"request {self.request}, step {self.step}: {self.kind} divergence: {self.detail}"]
        if self.kind != "requests":
            lines.append(f"  expected top-k: {_format_top(self.expected_top)}")
            lines.append(f"  actual top-k:   {_format_top(self.actual_top)}")
        if self.gap is not None and self.tolerance is not None:
            scale = "" if self.logit_scale is None else f" at logit scale {self.logit_scale:.4g}"
            lines.append(f"  gap {self.gap:.6g}, tolerance {self.tolerance:.6g}{scale}")
        lines.append(f"  producer: {self.producer if self.producer is not None else '-'}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Comparison:
    """The verdict. `allowed_flips` holds (request, step) of each near-tie flip that ended a request."""

    ok: bool
    divergences: list[Divergence]
    allowed_flips: list[tuple[int, int]]
    summary: str

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return "\n".join([self.summary, *(str(d) for d in self.divergences)])


def compare_generations(baseline: Sequence[Generation], candidate: Sequence[Generation], *,
                        steps: float = 2) -> Comparison:
    """Judge `candidate` against `baseline`, request by request, with a tolerance of `steps` bf16 steps."""
    logprob_tolerance(1.0, steps)  # validates `steps` before any work
    divergences: list[Divergence] = []
    flips: list[tuple[int, int]] = []
    compared = 0
    for index, (expected, actual) in enumerate(zip(baseline, candidate)):
        verdict = _compare_request(index, _steps_of(expected, index, "baseline"),
                                   _steps_of(actual, index, "candidate"), steps)
        compared += verdict.compared
        if verdict.divergence is not None:
            divergences.append(verdict.divergence)
        if verdict.flip_step is not None:
            flips.append((index, verdict.flip_step))
    if len(baseline) != len(candidate):
        divergences.append(Divergence(
            request=min(len(baseline), len(candidate)), step=0, kind="requests", expected_top=(), actual_top=(),
            gap=None, tolerance=None, producer=None,
            detail=f"baseline has {len(baseline)} requests, candidate has {len(candidate)}"))
    return Comparison(ok=not divergences, divergences=divergences, allowed_flips=flips,
                      summary=_summary(len(baseline), len(candidate), compared, divergences, flips, steps))


@dataclass(frozen=True)
class _RequestVerdict:
    compared: int
    divergence: Divergence | None = None
    flip_step: int | None = None


def _compare_request(request: int, expected: list[Step], actual: list[Step], steps: float) -> _RequestVerdict:
    for i, (want, got) in enumerate(zip(expected, actual)):
        try:
            tol = logprob_tolerance(want.logit_scale, steps)
        except ValueError as error:
            raise ValueError(f"baseline request {request}, step {i}: bad logit_scale: {error}") from None
        if len(got.top) != len(want.top):
            return _RequestVerdict(compared=i + 1, divergence=Divergence(
                request=request, step=i, kind="top", expected_top=want.top, actual_top=got.top, gap=None,
                tolerance=None, producer=got.producer, logit_scale=want.logit_scale,
                detail=(f"the top-k list has {len(got.top)} entries, the baseline's {len(want.top)}: the "
                        f"request asked for {len(want.top)} logprobs")))
        if got.token != want.token:
            gap, problem = _judge_flip(want, got, tol)
            if problem is None:
                return _RequestVerdict(compared=i + 1, flip_step=i)
            kind, detail = "token", problem
        else:
            gap = abs(got.logprob - want.logprob)
            if gap <= tol:  # NaN fails here too
                continue
            kind, detail = "logprob", (
                f"logprob of token {want.token} is {got.logprob:.6g}, baseline {want.logprob:.6g} "
                f"({gap / bf16_step(want.logit_scale):.3g} bf16 steps off, at most {steps} allowed)")
        return _RequestVerdict(compared=i + 1, divergence=Divergence(
            request=request, step=i, kind=kind, expected_top=want.top, actual_top=got.top, gap=gap,
            tolerance=tol, producer=got.producer, detail=detail, logit_scale=want.logit_scale))
    if len(expected) == len(actual):
        return _RequestVerdict(compared=len(expected))
    i = min(len(expected), len(actual))
    extra = expected[i] if len(expected) > i else actual[i]
    producer_step = actual[i] if len(actual) > i else (actual[-1] if actual else None)
    return _RequestVerdict(compared=i, divergence=Divergence(
        request=request, step=i, kind="length", expected_top=expected[i].top if len(expected) > i else (),
        actual_top=actual[i].top if len(actual) > i else (), gap=None, tolerance=None,
        producer=producer_step.producer if producer_step else None, logit_scale=extra.logit_scale,
        detail=f"baseline has {len(expected)} steps, candidate has {len(actual)}, without a flip"))


def _judge_flip(want: Step, got: Step, tol: float) -> tuple[float | None, str | None]:
    """(gap to the flipped-to token, or to the runner-up; why the flip is not allowed, or None)."""
    runner_up = _runner_up(want)
    if runner_up is None:
        return None, (f"token {want.token} became {got.token}; the baseline recorded no runner-up, "
                      "so no flip can be a near tie")
    tied = _near_tied(want, tol)
    if got.token in tied:
        return tied[got.token], None
    gap = abs(want.logprob - runner_up[1])
    if not tied:
        return gap, f"token {want.token} became {got.token}, but the baseline's top two are not a near tie"
    return gap, (f"token {want.token} became {got.token}; a near tie allows only the baseline's "
                 f"near-tied runner-up(s) {sorted(tied)}")


def _runner_up(step: Step) -> tuple[int, float] | None:
    """The best-ranked top entry other than the generated token."""
    others = [pair for pair in step.top if pair[0] != step.token]
    return max(others, key=lambda pair: pair[1]) if others else None


def _near_tied(step: Step, tol: float) -> dict[int, float]:
    """Top entries other than the generated token whose logprob is within `tol` of it, with their gap.

    Usually only the runner-up; but bf16 logits over a large vocabulary tie three ways often enough
    (seen with the 1B-shaped model on an H200: three tokens at one logprob), and then either of the
    other two is an equally valid greedy choice.
    """
    return {token: abs(step.logprob - logprob) for token, logprob in step.top
            if token != step.token and abs(step.logprob - logprob) <= tol}


def _steps_of(generation: Generation, request: int, side: str) -> list[Step]:
    steps = list(generation.steps)
    if len(steps) != len(generation.tokens):
        raise ValueError(f"{side} request {request} has {len(generation.tokens)} tokens but {len(steps)} "
                         "steps; compare_generations needs each token's logprob, top-k and logit scale")
    return steps


def _summary(n_baseline: int, n_candidate: int, compared: int, divergences: list[Divergence],
             flips: list[tuple[int, int]], steps: float) -> str:
    flipped = ""
    if flips:
        flipped = f"; {len(flips)} allowed near-tie flip(s) at " + ", ".join(
            f"request {r} step {s}" for r, s in flips)
    verdict = "ok" if not divergences else f"FAILED, {len(divergences)} divergence(s)"
    return (f"compare_generations: {verdict}: {min(n_baseline, n_candidate)} request(s), {compared} step(s) "
            f"compared within {steps} bf16 step(s){flipped}")


def _format_top(top: TopK) -> str:
    return "[" + ", ".join(f"{token}: {logprob:.6g}" for token, logprob in top) + "]"
