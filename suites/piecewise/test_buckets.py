"""Bucket validation, the default ladder, the smallest bucket that fits, and the dispatch rule."""

from __future__ import annotations

import pytest

from harness.runtime.piecewise.buckets import MIN_BUCKET, bucket_for, default_buckets, validate_buckets
from harness.runtime.dispatch import DECODE, EAGER_ROUTE, PIECEWISE, Route, route


def test_buckets_are_sorted_and_deduplicated():
    assert validate_buckets([64, 16, 64, 256, 16], max_num_tokens=256) == (16, 64, 256)


@pytest.mark.parametrize("buckets, message", [
    ([16, 0], "piecewise bucket 0 is not positive"),
    ([-4], "piecewise bucket -4 is not positive"),
    ([1, 8], "piecewise bucket 1 is below the minimum 2"),
    ([8, 300], "piecewise bucket 300 exceeds max_num_tokens 256"),
    ([8, 2.5], "piecewise bucket 2.5 is not an integer"),
    ([True], "piecewise bucket True is not an integer"),
    ([], "piecewise buckets are empty"),
])
def test_a_bad_bucket_is_named_with_its_limit(buckets, message):
    try:
        accepted = validate_buckets(buckets, max_num_tokens=256)
    except ValueError as error:
        assert message in str(error)
    else:
        pytest.fail(f"piecewise buckets {buckets} were accepted as {accepted} with max_num_tokens 256; "
                    f"expected the refusal {message!r}")


@pytest.mark.parametrize("max_num_tokens", [2, 3, 100, 256, 512, 600, 2048, 2100])
def test_the_default_ladder_reaches_max_num_tokens(max_num_tokens):
    ladder = default_buckets(max_num_tokens)
    assert list(ladder) == sorted(set(ladder)) and all(isinstance(b, int) for b in ladder)
    assert ladder[0] == MIN_BUCKET and ladder[-1] == max_num_tokens
    assert all(bucket_for(n, ladder) is not None for n in range(1, max_num_tokens + 1))


def test_the_default_ladder_is_powers_of_two_then_steps():
    assert default_buckets(1024) == (2, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1024)


def test_the_smallest_bucket_that_fits():
    buckets = (4, 16, 64)
    assert [bucket_for(n, buckets) for n in (1, 4, 5, 16, 17, 64, 65, 0)] == [4, 4, 16, 16, 64, 64, None, None]


class Sizes:
    def __init__(self, *sizes):
        self.sizes = sizes

    def size_for(self, num_seqs):
        return bucket_for(num_seqs, self.sizes)

    def no_graph_reason(self, num_seqs):
        return f"decode batch of {num_seqs} exceeds the largest decode graph ({max(self.sizes)})"


def test_dispatch_routes_each_kind():
    buckets = (16, 64)
    assert route("prefill", 3, 20, buckets=buckets) == Route(PIECEWISE, 64)
    assert route("mixed", 5, 16, buckets=buckets) == Route(PIECEWISE, 16)
    assert route("decode", 3, 3, decode_graphs=Sizes(1, 2, 4), buckets=buckets) == Route(DECODE, 4)
    over = route("prefill", 2, 65, buckets=buckets)
    assert over.kind == EAGER_ROUTE and "65 tokens: above the largest piecewise bucket 64" in over.reason
    assert over.fallback
    assert route("decode", 5, 5, decode_graphs=Sizes(1, 2, 4)).reason == \
        "decode batch of 5 exceeds the largest decode graph (4)"
    assert route("decode", 2, 2).reason == "decode batch: no decode graphs configured"
    assert not route("decode", 2, 2).fallback and not route("prefill", 1, 4).fallback
    assert route("prefill", 1, 4).reason == "prefill batch: no piecewise buckets configured"
    with pytest.raises(ValueError, match="batch kind 'other'"):
        route("other", 1, 1)
