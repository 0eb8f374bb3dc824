"""Size arithmetic and checks shared by the KV cache, the metadata and the engine."""

from __future__ import annotations


def cdiv(numerator: int, denominator: int) -> int:
    """Ceiling division: how many blocks of `denominator` hold `numerator` items."""
    return -(-numerator // denominator)


def require_positive(**sizes: int) -> None:
    """Refuse any size below 1, naming it and its value."""
    for name, value in sizes.items():
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
