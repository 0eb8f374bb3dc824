"""Token buckets of piecewise graphs: which token counts are captured, and which one a batch uses.

A bucket is a padded token count. It must be positive, at most `max_num_tokens` (the metadata
buffers' size: a larger bucket could never be reached, and slicing for it would run off the
buffers), and at least `MIN_BUCKET`: torch.compile specializes sizes 0 and 1 of a dynamic dimension,
so a batch of one token row would compile a second graph while serving. Buckets are kept sorted
and deduplicated.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from harness.ops.sizing import smallest_fitting

# dynamo treats sizes 0 and 1 as constants; a graph traced for them would be a surprise recompile.
MIN_BUCKET = 2
# Powers of two up to 512, then every 256: like the ladders serving runtimes capture by default.
_LADDER_STEP = 256


def validate_buckets(buckets: Iterable[int], max_num_tokens: int) -> tuple[int, ...]:
    """Sorted, deduplicated buckets, or a `ValueError` naming the first bad bucket and the limit."""
    values = list(buckets)
    if not values:
        raise ValueError("piecewise buckets are empty: give at least one token count "
                         f"in [{MIN_BUCKET}, max_num_tokens {max_num_tokens}]")
    for bucket in values:
        if not isinstance(bucket, int) or isinstance(bucket, bool):
            raise ValueError(f"piecewise bucket {bucket!r} is not an integer token count")
        if bucket < 1:
            raise ValueError(f"piecewise bucket {bucket} is not positive; buckets are token counts "
                             f">= {MIN_BUCKET}")
        if bucket < MIN_BUCKET:
            raise ValueError(f"piecewise bucket {bucket} is below the minimum {MIN_BUCKET}: "
                             f"torch.compile specializes sizes 0 and 1, so it would recompile")
        if bucket > max_num_tokens:
            raise ValueError(f"piecewise bucket {bucket} exceeds max_num_tokens {max_num_tokens}: "
                             f"no batch can reach it and the metadata buffers cannot hold it")
    return tuple(sorted(set(values)))


def default_buckets(max_num_tokens: int) -> tuple[int, ...]:
    """Powers of two from MIN_BUCKET up to 512, then steps of 256, capped by and always including
    `max_num_tokens` (so every batch the scheduler can form has a bucket)."""
    if max_num_tokens < MIN_BUCKET:
        raise ValueError(f"max_num_tokens {max_num_tokens} is below the smallest bucket {MIN_BUCKET}")
    ladder = []
    size = MIN_BUCKET
    while size < min(max_num_tokens, 512):
        ladder.append(size)
        size *= 2
    size = 512 + _LADDER_STEP
    while size < max_num_tokens:
        ladder.append(size)
        size += _LADDER_STEP
    if max_num_tokens >= 512:
        ladder.append(512)
    ladder.append(max_num_tokens)
    return validate_buckets(ladder, max_num_tokens)


def bucket_for(num_tokens: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket that holds `num_tokens` token rows, or None when none does (and for a
    count below 1, which no batch has)."""
    return smallest_fitting(num_tokens, buckets)
