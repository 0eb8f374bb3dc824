"""Which producer runs a batch (docs/design.md, "The reference runtime", dispatch).

- decode-only: the smallest captured decode graph that holds the batch's sequences;
- prefill or mixed: the smallest piecewise bucket that holds its token rows (the output is
  truncated to the real sequences);
- anything else: eager, with the reason. A batch whose kind has graphs configured but none that
  fits is a fallback, which the engine counts; a batch whose kind has no graphs configured runs
  eager by request (a prefill on an engine with decode graphs only), not by fallback.

The decision reads host-side counts of the scheduled batch only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from harness.runtime.piecewise import buckets as bucket_rules

DECODE, PIECEWISE, EAGER_ROUTE = "decode", "piecewise", "eager"


class DecodeSizes(Protocol):
    """What dispatch needs of the decode graphs: which captured batch size holds `num_seqs`
    sequences (None when none does), and why none does. The engine runs the chosen size."""

    def size_for(self, num_seqs: int) -> int | None: ...

    def no_graph_reason(self, num_seqs: int) -> str: ...


@dataclass(frozen=True)
class Route:
    """`kind` is DECODE, PIECEWISE or EAGER_ROUTE; `size` the decode batch size or the token bucket;
    `reason` says why a batch runs eagerly, and `fallback` whether graphs of its kind were configured
    but none fits (the engine counts those)."""

    kind: str
    size: int | None = None
    reason: str | None = None
    fallback: bool = False


def route(kind: str, num_seqs: int, num_tokens: int, *, decode_graphs: DecodeSizes | None = None,
          buckets: Sequence[int] = ()) -> Route:
    """The route of a batch of `kind` ("prefill", "decode" or "mixed") with `num_seqs` sequences
    and `num_tokens` token rows."""
    if kind == "decode":
        if decode_graphs is None:
            return Route(EAGER_ROUTE, reason="decode batch: no decode graphs configured")
        size = decode_graphs.size_for(num_seqs)
        if size is None:
            return Route(EAGER_ROUTE, reason=decode_graphs.no_graph_reason(num_seqs), fallback=True)
        return Route(DECODE, size=size)
    if kind not in ("prefill", "mixed"):
        raise ValueError(f"batch kind {kind!r} is not one of prefill, decode, mixed")
    if not buckets:
        return Route(EAGER_ROUTE, reason=f"{kind} batch: no piecewise buckets configured")
    bucket = bucket_rules.bucket_for(num_tokens, buckets)
    if bucket is None:
        return Route(EAGER_ROUTE, reason=f"{kind} batch of {num_tokens} tokens: above the largest "
                                         f"piecewise bucket {max(buckets)}", fallback=True)
    return Route(PIECEWISE, size=bucket)
