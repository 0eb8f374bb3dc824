"""BF16-step comparison of generations, on crafted sequences where the expected verdict is known."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.check import Comparison, bf16_step, compare_generations
from harness.check.strategies import generations
from harness.check.tolerance import logprob_tolerance
from harness.records import Generation, Step

SCALE = 20.0  # bf16 step 1/8, so the default tolerance is 0.25
TOL = 2 * 0.125


def step(token, logprob=-0.5, runner_up=None, *, scale=SCALE, producer="eager"):
    runner_up = runner_up if runner_up is not None else (token + 1, logprob - 3.0)
    return Step(token=token, logprob=logprob, top=((token, logprob), runner_up), logit_scale=scale,
                producer=producer)


def gen(*steps):
    return Generation.from_steps(list(steps))


def shifted(generation, request_step, delta=0.0, **changes):
    """A copy of `generation` whose step `request_step` has its logprob moved by `delta` (top-k too)."""
    steps = list(generation.steps)
    old = steps[request_step]
    logprob = old.logprob + delta
    top = tuple((t, lp + delta if t == old.token else lp) for t, lp in old.top)
    steps[request_step] = dataclasses.replace(old, logprob=logprob, top=top, **changes)
    return Generation.from_steps(steps)


BASELINE = [gen(step(5), step(9), step(2)), gen(step(7), step(7), step(3), step(1))]


def test_identical_runs_pass():
    result = compare_generations(BASELINE, BASELINE)
    assert result.ok and result.divergences == [] and result.allowed_flips == []
    assert "ok" in result.summary and "7 step(s)" in result.summary


def test_drift_within_the_steps_passes_and_beyond_fails():
    one_step = [BASELINE[0], shifted(BASELINE[1], 2, +0.125)]
    three_steps = [BASELINE[0], shifted(BASELINE[1], 2, -3 * 0.125, producer="decode[bs=2]")]
    assert compare_generations(BASELINE, one_step).ok
    result = compare_generations(BASELINE, three_steps)
    assert not result.ok
    (d,) = result.divergences
    assert (d.request, d.step, d.kind, d.producer) == (1, 2, "logprob", "decode[bs=2]")
    assert d.gap == pytest.approx(0.375) and d.tolerance == TOL


def test_steps_argument_sets_the_tolerance():
    three_steps = [BASELINE[0], shifted(BASELINE[1], 0, 3 * 0.125)]
    assert not compare_generations(BASELINE, three_steps).ok
    assert compare_generations(BASELINE, three_steps, steps=3).ok
    with pytest.raises(ValueError, match="steps must be"):
        compare_generations(BASELINE, BASELINE, steps=-1)


def test_tolerance_scales_with_the_logit_magnitude():
    drift = 0.1  # under 2 steps at |logit| 20 (0.25), far over at |logit| 1 (2 * 2**-7)
    for scale, ok in ((20.0, True), (1.0, False)):
        baseline = [gen(step(4, scale=scale), step(6, scale=scale))]
        candidate = [shifted(baseline[0], 1, drift)]
        assert compare_generations(baseline, candidate).ok is ok


def test_near_tie_flip_to_the_runner_up_passes_and_ends_the_request():
    tie = step(8, -0.70, runner_up=(3, -0.80))  # gap 0.1 <= 0.25
    baseline = [gen(step(5), tie, step(9), step(9)), BASELINE[1]]
    garbage = step(100, logprob=-50.0, scale=1.0)
    flipped = [gen(step(5), step(3, -0.80, runner_up=(8, -0.70), producer="decode[bs=2]"), garbage), BASELINE[1]]
    result = compare_generations(baseline, flipped)
    assert result.ok, str(result)
    assert result.allowed_flips == [(0, 1)]
    assert "allowed near-tie flip" in result.summary


def test_flip_to_another_token_fails_even_at_a_near_tie():
    baseline = [gen(step(5), step(8, -0.70, runner_up=(3, -0.80)))]
    candidate = [gen(step(5), step(4, -0.70))]
    (d,) = compare_generations(baseline, candidate).divergences
    assert (d.kind, d.step) == ("token", 1)
    assert "near-tied runner-up(s) [3]" in d.detail


def test_flip_to_a_third_token_of_a_three_way_tie_passes():
    # Seen on an H200 with the 1B-shaped model: two tokens at one logprob and a third 0.0625 below,
    # all within 2 bf16 steps (0.25) at logit scale 18.4; the candidate picked the third.
    tie = Step(token=26555, logprob=-3.28484, top=((26555, -3.28484), (57901, -3.28484), (12428, -3.34734),
                                                   (108277, -3.53484)), logit_scale=18.38)
    flipped = Step(token=12428, logprob=-3.29188, top=((12428, -3.29188), (26555, -3.29188),
                                                       (57901, -3.29188), (108277, -3.54188)), logit_scale=18.38)
    result = compare_generations([gen(step(5), tie)], [gen(step(5), flipped)])
    assert result.ok, str(result)
    assert result.allowed_flips == [(0, 1)]
    # ...but not to the fourth token, 0.25 + 0.0000x away: outside the tolerance.
    too_far = Step(token=108277, logprob=-3.29, top=((108277, -3.29), (26555, -3.3), (57901, -3.3)),
                   logit_scale=18.38)
    far_tie = Step(token=26555, logprob=-3.28484, top=((26555, -3.28484), (57901, -3.28484),
                                                       (108277, -3.54)), logit_scale=18.38)
    (d,) = compare_generations([gen(step(5), far_tie)], [gen(step(5), too_far)]).divergences
    assert d.kind == "token" and "[57901]" in d.detail


def test_flip_without_a_near_tie_fails():
    baseline = [gen(step(5), step(8, -0.2, runner_up=(3, -1.0)))]  # gap 0.8 > 0.25
    candidate = [gen(step(5), step(3, -1.0))]
    result = compare_generations(baseline, candidate)
    (d,) = result.divergences
    assert (d.kind, d.gap) == ("token", pytest.approx(0.8))
    assert "not a near tie" in d.detail


def test_flip_without_a_recorded_runner_up_fails():
    lonely = Step(token=8, logprob=-0.1, top=((8, -0.1),), logit_scale=SCALE)
    candidate = [gen(Step(token=3, logprob=-0.1, top=((3, -0.1),), logit_scale=SCALE))]
    (d,) = compare_generations([gen(lonely)], candidate).divergences
    assert d.kind == "token" and "no runner-up" in d.detail


@pytest.mark.parametrize("cut", ["shorter", "longer"])
def test_length_mismatch_without_a_flip_fails(cut):
    baseline = [BASELINE[1]]
    steps = list(BASELINE[1].steps)
    candidate = [gen(*steps[:-1])] if cut == "shorter" else [gen(*steps, step(11, producer="decode[bs=1]"))]
    (d,) = compare_generations(baseline, candidate).divergences
    assert (d.request, d.step, d.kind) == (0, 3 if cut == "shorter" else 4, "length")
    assert d.producer == ("eager" if cut == "shorter" else "decode[bs=1]")


def test_different_number_of_requests_fails():
    result = compare_generations(BASELINE, BASELINE[:1])
    (d,) = result.divergences
    assert (d.kind, d.request) == ("requests", 1)
    assert not compare_generations(BASELINE[:1], BASELINE).ok


def test_stale_buffer_candidate_fails():
    # A graph that reads a buffer the runtime rebound replays the first step's logits again and again.
    baseline = [gen(step(5, -0.3), step(9, -1.1), step(2, -0.6))]
    stale_logprobs = [Generation.from_steps([dataclasses.replace(s, logprob=-0.3, top=((s.token, -0.3),)
                                                                 + s.top[1:]) for s in baseline[0].steps])]
    stale_tokens = [gen(step(5, -0.3), step(5, -0.3), step(5, -0.3))]
    for candidate in (stale_logprobs, stale_tokens):
        result = compare_generations(baseline, candidate)
        assert not result.ok and result.divergences[0].step == 1


def test_report_names_request_step_top_k_gap_tolerance_and_producer():
    candidate = [BASELINE[0], shifted(BASELINE[1], 2, -1.0, producer="decode[bs=2]")]
    text = str(compare_generations(BASELINE, candidate))
    assert text.splitlines()[0].startswith("compare_generations: FAILED, 1 divergence(s)")
    assert "request 1, step 2: logprob divergence" in text
    assert "expected top-k: [3: -0.5, 4: -3.5]" in text
    assert "actual top-k:   [3: -1.5, 4: -3.5]" in text
    assert "gap 1, tolerance 0.25 at logit scale 20" in text
    assert "producer: decode[bs=2]" in text


def test_only_the_first_divergence_of_each_request_is_reported():
    candidate = [shifted(shifted(BASELINE[0], 0, 1.0), 2, 1.0), shifted(BASELINE[1], 3, 1.0)]
    result = compare_generations(BASELINE, candidate)
    assert [(d.request, d.step) for d in result.divergences] == [(0, 0), (1, 3)]


def test_nan_logprob_fails_and_a_bad_baseline_scale_raises():
    assert not compare_generations(BASELINE, [shifted(BASELINE[0], 1, math.nan), BASELINE[1]]).ok
    broken = [Generation.from_steps([dataclasses.replace(BASELINE[0].steps[0], logit_scale=math.inf)])]
    with pytest.raises(ValueError, match="request 0, step 0"):
        compare_generations(broken, broken)


def test_generations_without_steps_are_refused():
    with pytest.raises(ValueError, match="candidate request 0 has 2 tokens but 0 steps"):
        compare_generations([gen(step(1), step(2))], [Generation(tokens=[1, 2])])


# --- bf16_step against torch's own bf16 spacing ------------------------------------------------------

def _torch_bf16_spacing(values):
    """The gap from each bf16 value to its neighbour away from zero (the upward gap in magnitude)."""
    x = torch.tensor(values, dtype=torch.float64).to(torch.bfloat16)
    away = torch.nextafter(x, torch.where(x < 0, -math.inf, math.inf).to(torch.bfloat16))
    return (away.double() - x.double()).abs().tolist(), x.double().tolist()


def test_bf16_step_matches_torch_over_many_magnitudes():
    values = [sign * m * 2.0 ** e for e in range(-140, 127, 3) for m in (1.0, 1.3, 1.99) for sign in (1, -1)]
    spacings, representable = _torch_bf16_spacing(values)
    for x, expected in zip(representable, spacings):
        assert bf16_step(x) == expected, x


def test_bf16_step_documented_points_and_edges():
    assert bf16_step(1.0) == 2.0 ** -7
    assert bf16_step(16.0) == bf16_step(31.9) == bf16_step(-20.0) == 0.125
    assert bf16_step(32.0) == 0.25
    assert bf16_step(0.0) == bf16_step(1e-40) == 2.0 ** -133
    for bad in (math.nan, math.inf, -math.inf, 2.0 ** 128):
        with pytest.raises(ValueError):
            bf16_step(bad)
    assert logprob_tolerance(20.0) == 0.25 and logprob_tolerance(1.0, steps=4) == 4 * 2.0 ** -7


# --- properties -------------------------------------------------------------------------------------

@pytest.mark.property
@settings(deadline=None)
@given(generations())
def test_property_a_run_always_matches_itself(runs):
    assert compare_generations(runs, runs).ok


@pytest.mark.property
@settings(deadline=None)
@given(generations(), st.data())
def test_property_drift_under_k_steps_passes_and_over_k_fails(runs, data):
    k = data.draw(st.sampled_from([1, 2, 4]), label="k")
    fraction = data.draw(st.floats(0.0, 0.95), label="fraction")

    def drifted(tolerances):
        """Every step's logprob lowered by `tolerances` times its own tolerance."""
        return [Generation.from_steps([
            dataclasses.replace(s, logprob=s.logprob - tolerances * logprob_tolerance(s.logit_scale, k))
            for s in g.steps]) for g in runs]

    assert compare_generations(runs, drifted(fraction), steps=k).ok
    result = compare_generations(runs, drifted(1.05), steps=k)
    assert result.ok == (sum(len(g.steps) for g in runs) == 0)


def test_comparison_is_frozen_and_truthy():
    result = compare_generations(BASELINE, BASELINE)
    assert isinstance(result, Comparison) and bool(result)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.ok = False


def test_a_candidate_with_exploding_logits_does_not_widen_its_own_tolerance():
    baseline = [gen(step(4, scale=1.0), step(6, scale=1.0))]
    candidate = [shifted(baseline[0], 1, 0.1, logit_scale=1000.0)]  # 0.1 is within 2 steps at |logit| 1000
    (d,) = compare_generations(baseline, candidate).divergences
    assert d.tolerance == 2 * 2.0 ** -7 and d.logit_scale == 1.0


def test_a_top_list_shorter_or_longer_than_the_baseline_is_a_divergence():
    # The request asked for the baseline's number of logprobs; a runtime (a graph that ranked too
    # few on the device) returning another number is wrong even when every token and logprob agree.
    short = dataclasses.replace(BASELINE[1].steps[2], top=BASELINE[1].steps[2].top[:1],
                                producer="decode[bs=4,top1]")
    longer = dataclasses.replace(BASELINE[1].steps[2], top=BASELINE[1].steps[2].top + ((40, -9.0),))
    same_length = dataclasses.replace(BASELINE[1].steps[2], top=(BASELINE[1].steps[2].top[0], (41, -9.0)))
    for changed, ok in ((short, False), (longer, False), (same_length, True)):
        steps = list(BASELINE[1].steps)
        steps[2] = changed
        result = compare_generations(BASELINE, [BASELINE[0], Generation.from_steps(steps)])
        assert result.ok is ok, str(result)
    steps = list(BASELINE[1].steps)
    steps[2] = short
    (d,) = compare_generations(BASELINE, [BASELINE[0], Generation.from_steps(steps)]).divergences
    assert (d.request, d.step, d.kind, d.producer) == (1, 2, "top", "decode[bs=4,top1]")
    assert "the top-k list has 1 entries, the baseline's 2" in str(d)
