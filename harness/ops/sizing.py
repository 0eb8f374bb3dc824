"""Size arithmetic and checks shared by the KV cache, the metadata and the engine."""

from __future__ import annotations

from typing import Iterable


def cdiv(numerator: int, denominator: int) -> int:
    """Ceiling division: how many blocks of `denominator` hold `numerator` items."""
    return -(-numerator // denominator)


def require_positive(**sizes: int) -> None:
    """Refuse any size below 1, naming it and its value."""
    for name, value in sizes.items():
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")


def smallest_fitting(count: int, sizes: Iterable[int]) -> int | None:
    """The smallest of `sizes` that holds `count` (a batch size, a token count, a top-k width), or
    None when none does, and for a count below 1, which nothing has."""
    if count < 1:
        return None
    return min((size for size in sizes if size >= count), default=None)
