"""What the ranks of one engine agree on while capturing decode graphs, one collective each.

Every rank asks the same questions in the same order and acts on the gathered answers, so all ranks
take the same path and none waits in a collective its peers skip:

- `single_pass(comm, wants)`: the single pass is tried only if every rank wants it;
- `sizes(comm, sizes, buildable)`: only the sizes every rank can build a dummy batch for are captured;
- `line_up(comm, backend, key)`: after each capture, before its replay, every rank is at the same key;
- `moved(comm, moved)`: after a single pass, a tensor that moved on any rank discards it on all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from harness.runtime.comm import Comm


@dataclass(frozen=True)
class RankAgreement:
    """The reference agreement (one allgather per question); a subclass may override any answer."""

    def single_pass(self, comm: Comm, wants: bool) -> bool:
        return all(comm.allgather_object(bool(wants)))

    def sizes(self, comm: Comm, sizes: Sequence[int], buildable: Sequence[int]) -> tuple[list[int], list[int]]:
        """(sizes every rank can build, sizes some rank cannot), in the order of `sizes`."""
        gathered = comm.allgather_object(list(buildable))
        common = set(sizes).intersection(*map(set, gathered))
        return [s for s in sizes if s in common], [s for s in sizes if s not in common]

    def line_up(self, comm: Comm, backend: Any, key: object) -> None:
        """Sync the device and meet every rank; ranks at different keys are an error naming them."""
        backend.synchronize()
        seen = comm.allgather_object(str(key))
        if len(set(seen)) != 1:
            raise RuntimeError(f"ranks lined up at different decode graphs: {seen} (rank order); every "
                               f"rank must capture the same keys in the same order")

    def moved(self, comm: Comm, moved: Sequence[str]) -> bool:
        """True if a tensor a single-pass graph baked in moved on any rank."""
        return any(comm.allgather_object(bool(moved)))
