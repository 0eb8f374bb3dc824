"""Host writes that no dispatcher sees: a pinned buffer written through a numpy view (or a raw
pointer) while a copy that reads it waits in its stream's queue. The tracker never hears of such a
write; the queued copy can tell: it keeps the bytes its pinned inputs held when it was issued, and
if they changed by the time it runs, with no tracked write in between, the host wrote them behind
the dispatcher's back before the copy read them (a race PyTorch's stream sanitizer misses too)."""

from __future__ import annotations

import torch

UNSEEN_HOST_WRITE = "a host write no dispatcher saw (through a numpy view or a raw pointer)"


class IssuedBytes:
    """The pinned inputs of a queued op, each with a copy of what it held when the op was issued
    and a token of the caller's (the tracker's count of writes to it then)."""

    def __init__(self, inputs: list[tuple[torch.Tensor, int]]) -> None:
        self._kept = [(t, t.clone(), token) for t, token in inputs]

    def __bool__(self) -> bool:
        return bool(self._kept)

    def changed(self) -> list[tuple[torch.Tensor, int]]:
        """(input, token) for the inputs whose bytes differ now from when the op was issued."""
        return [(t, token) for t, kept, token in self._kept if not torch.equal(t, kept)]
