"""Which blocks of a list apply to a machine: the facts of a machine and condition matching."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from harness.testdb.schema import TERM_VALUES, Condition, TestDbError, TestLine, TestList


@dataclass(frozen=True)
class Machine:
    """The facts conditions test. `gpu` is the CUDA device name ("" without one)."""

    gpu_count: int
    gpu: str
    stage: str
    backend: str

    def __post_init__(self) -> None:
        if self.gpu_count < 0:
            raise TestDbError(f"gpu_count {self.gpu_count} must be >= 0")
        for key, allowed in TERM_VALUES.items():
            if getattr(self, key) not in allowed:
                raise TestDbError(f"{key} {getattr(self, key)!r} is not one of {', '.join(allowed)}")

    def __str__(self) -> str:
        return f"gpu_count={self.gpu_count} gpu={self.gpu!r} stage={self.stage} backend={self.backend}"


def detect_machine(*, gpu_count: int | None = None, gpu: str | None = None, stage: str = "pre_merge",
                   backend: str | None = None) -> Machine:
    """This machine's facts as torch sees them; any argument that is not None overrides its fact."""
    import torch

    cuda = torch.cuda.is_available()
    if gpu_count is None:
        gpu_count = torch.cuda.device_count() if cuda else 0
    if gpu is None:
        gpu = torch.cuda.get_device_name(0) if cuda else ""
    if backend is None:
        from harness.graphs import resolve_backend

        backend = resolve_backend("auto")
    return Machine(gpu_count=gpu_count, gpu=gpu, stage=stage, backend=backend)


def matches(condition: Condition, machine: Machine) -> bool:
    return (
        all(bound.contains(getattr(machine, key)) for key, bound in condition.ranges)
        and all(any(fnmatchcase(getattr(machine, key).lower(), p.lower()) for p in patterns)
                for key, patterns in condition.wildcards)
        and all(getattr(machine, key) in values for key, values in condition.terms)
    )


def select(test_list: TestList, machine: Machine) -> list[TestLine]:
    """The lines of every block whose condition holds on `machine`, in list order, each once."""
    selected: dict[TestLine, None] = {}
    for block in test_list.blocks:
        if matches(block.condition, machine):
            selected.update(dict.fromkeys(block.tests))
    return list(selected)
