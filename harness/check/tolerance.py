"""Tolerances counted in BF16 steps.

A bf16 number keeps 8 significant bits, so two correct runs that add the same logits in a different
order (a graph vs eager, another kernel split) differ by a few units in the last place of the largest
logit. A logprob is a logit minus a log-sum-exp dominated by that largest logit, so it inherits the
same absolute error: the tolerance is a number of bf16 steps at the step's logit scale, not a fixed
epsilon. A fixed epsilon is too tight at |logit| 30 and far too loose at |logit| 1.
"""

from __future__ import annotations

import math

# bf16 shares float32's exponent range: 7 stored mantissa bits, normals from 2**-126, last binade 2**127.
_MANTISSA_BITS = 7
_MIN_NORMAL_EXPONENT = -126
_MAX_EXPONENT = 127


def bf16_step(x: float) -> float:
    """The spacing of bf16 numbers at |x|: 2**-7 for 1 <= |x| < 2, 1/8 for 16 <= |x| < 32.

    It is the gap from |x| up to the next bf16 number, taken in the binade of |x| itself (so at an
    exact power of two it is the larger, upward gap). Zero and subnormal magnitudes get the subnormal
    spacing 2**-133. NaN, infinities and magnitudes bf16 cannot hold (2**128 and above) raise ValueError.
    """
    x = float(x)
    if math.isnan(x) or math.isinf(x):
        raise ValueError(f"bf16_step needs a finite value, got {x}")
    magnitude = abs(x)
    if magnitude >= 2.0 ** (_MAX_EXPONENT + 1):
        raise ValueError(f"bf16_step: |x| = {magnitude:g} is beyond bf16's range (below 2**128)")
    if magnitude < 2.0 ** _MIN_NORMAL_EXPONENT:
        return 2.0 ** (_MIN_NORMAL_EXPONENT - _MANTISSA_BITS)
    exponent = math.frexp(magnitude)[1] - 1  # magnitude lies in [2**exponent, 2**(exponent + 1))
    return 2.0 ** (exponent - _MANTISSA_BITS)


def logprob_tolerance(logit_scale: float, steps: float = 2) -> float:
    """How far a logprob may drift: `steps` bf16 steps at the logit scale (max |logit|) of its step."""
    if not steps >= 0 or math.isinf(steps):
        raise ValueError(f"steps must be a finite number >= 0, got {steps}")
    return steps * bf16_step(logit_scale)
