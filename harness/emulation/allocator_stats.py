"""c10's allocator counters, as the emulated device's allocator models report them: `Stat` (current,
peak, and the sums of increases and decreases) for the device's caching allocator
(caching_allocator.py) and the pinned-memory one (host_allocator.py), and `DurationStat`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Stat:
    """One of the allocator's counters, as c10's `Stat`."""

    current: int = 0
    peak: int = 0
    allocated: int = 0
    freed: int = 0

    def increase(self, amount: int) -> None:
        self.current += amount
        self.allocated += amount
        self.peak = max(self.peak, self.current)

    def decrease(self, amount: int) -> None:
        self.current -= amount
        self.freed += amount

    def reset_peak(self) -> None:
        self.peak = self.current

    def reset_accumulated(self) -> None:
        self.allocated = self.freed = 0

    def as_dict(self) -> dict[str, int]:
        return {"current": self.current, "peak": self.peak, "allocated": self.allocated,
                "freed": self.freed}


@dataclass
class DurationStat:
    """c10's `DurationStat`: microseconds spent in the driver's calls."""

    total: int = 0
    max: int = 0
    min: int = 0
    count: int = 0

    def add(self, microseconds: int) -> None:
        self.min = microseconds if self.count == 0 else min(self.min, microseconds)
        self.max = max(self.max, microseconds)
        self.total += microseconds
        self.count += 1

    def as_dict(self) -> dict[str, int]:
        avg = self.total // self.count if self.count else 0
        return {"total": self.total, "max": self.max, "min": self.min, "count": self.count,
                "avg": avg}
