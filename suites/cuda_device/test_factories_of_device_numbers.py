"""Factories given a 0-dim device tensor where they take a number: `torch.arange(n)`,
`torch.full(size, fill)`, `torch.zeros(n)`, `torch.randint(high, size)`, and `torch.linspace` /
`torch.logspace` of tensor bounds. CUDA reads the number on the host (the argument parser's, or
the op's, `.item()`: a sync, flagged by the sync debug mode and refused in a capture) and makes
the result where `device` says, the host by default, as for any factory. The emulated device took
the device tensor as a device call's operand and made a device tensor. The `cuda_kind` rows show
CUDA's own answers on a GPU."""

from __future__ import annotations

from typing import Callable

import pytest
import torch

from suites.cuda_device._own_process import in_a_process_of_its_own

NOT_PERMITTED = "operation not permitted when stream is capturing"
SYNC_FLAGGED = "called a synchronizing CUDA operation"

Call = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# name: a factory given `n`, a 0-dim device int tensor (4), and `x`, a 0-dim device float (0.5)
FACTORIES: dict[str, Call] = {
    "arange": lambda n, x: torch.arange(n),
    "full": lambda n, x: torch.full((2,), x),
    "zeros": lambda n, x: torch.zeros(n),
    "randint": lambda n, x: torch.randint(n, (3,)),
    "linspace of tensor bounds": lambda n, x: torch.linspace(x, x + 1, 5),
    "logspace of a tensor bound": lambda n, x: torch.logspace(x, 2.0, 3),
}


def _numbers() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(4, device="cuda"), torch.tensor(0.5, device="cuda")


@pytest.mark.parametrize("tracked", [False, True], ids=["", "streams_tracked"])
@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_a_device_number_makes_a_host_tensor_unless_device_names_one(cuda_kind, name, tracked):
    if tracked:
        torch.cuda.Stream()  # a second stream turns the emulated device's stream tracking on
    n, x = _numbers()
    assert FACTORIES[name](n, x).device.type == "cpu"
    with torch.device("cuda"):
        assert FACTORIES[name](n, x).is_cuda


def test_the_values_are_the_numbers(cuda_kind):
    n, x = _numbers()
    assert torch.arange(n).tolist() == [0, 1, 2, 3]
    assert torch.full((2,), x).tolist() == [0.5, 0.5]
    assert torch.linspace(x, x + 1, 3).tolist() == [0.5, 1.0, 1.5]
    assert torch.arange(n, device="cuda").is_cuda


def test_the_read_is_a_sync_the_debug_mode_flags(cuda_kind):
    n, _ = _numbers()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match=SYNC_FLAGGED):
            torch.arange(n)
    finally:
        torch.cuda.set_sync_debug_mode(0)


def _capture_outcome() -> tuple[list[str], str | None]:
    n, _ = _numbers()
    graph = torch.cuda.CUDAGraph()
    errors: list[str] = []
    ended = None
    caller = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph):
            try:
                torch.arange(n, device="cuda")
            except RuntimeError as error:
                errors.append(str(error))
    except RuntimeError as error:
        ended = str(error)
    finally:
        torch.cuda.set_stream(caller)
    return errors, ended


def test_the_read_inside_a_capture_is_refused_as_a_sync(cuda_kind):
    errors, ended = (in_a_process_of_its_own(__file__, "_capture_outcome") if cuda_kind == "native"
                     else _capture_outcome())
    assert len(errors) == 1 and NOT_PERMITTED in errors[0], errors
    assert ended is not None
