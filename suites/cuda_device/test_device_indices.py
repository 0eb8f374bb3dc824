"""Several emulated devices (`emulate_cuda(device_count=2)`): a tensor says which device it is on,
ops keep their inputs' device and refuse two devices with CUDA's text, copies between devices are
real copies, and an index the device lacks raises CUDA's invalid device ordinal."""

from __future__ import annotations

import io
from typing import Iterator

import pytest
import torch

import harness


@pytest.fixture
def two_devices(outside_emulation) -> Iterator[None]:
    with harness.emulate_cuda(device="cpu", device_count=2):
        yield


def test_a_tensor_on_the_second_device_says_so_and_so_do_its_results(two_devices):
    x = torch.ones(3, device="cuda:1")
    assert str(x.device) == "cuda:1" and x.get_device() == 1 and x.is_cuda
    for result in (x * 2, x.sum(), x[1:], torch.empty_like(x), x.clone()):
        assert str(result.device) == "cuda:1"
    assert str(torch.ones(3, device="cuda").device) == "cuda:0"


def test_the_current_device_decides_where_cuda_goes(two_devices):
    torch.cuda.set_device(1)
    assert torch.cuda.current_device() == 1
    assert str(torch.zeros(1, device="cuda").device) == "cuda:1"
    torch.cuda.set_device(0)
    with torch.cuda.device(1):
        assert str(torch.zeros(1, device="cuda").device) == "cuda:1"
    assert str(torch.zeros(1, device="cuda").device) == "cuda:0"


def test_an_op_across_two_devices_raises_cudas_error(two_devices):
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device, but "
                                           r"found at least two devices, cuda:0 and cuda:1!"):
        torch.ones(2, device="cuda:0") + torch.ones(2, device="cuda:1")


def test_moving_between_devices_copies(two_devices):
    x = torch.ones(2, device="cuda:0")
    moved = x.to("cuda:1")
    assert moved is not x and str(moved.device) == "cuda:1" and str(x.device) == "cuda:0"
    moved.add_(1)
    assert x.tolist() == [1.0, 1.0] and moved.tolist() == [2.0, 2.0]
    assert str(moved.cuda(0).device) == "cuda:0" and moved.cuda(1) is moved
    assert str(torch.ones(2).cuda(1).device) == "cuda:1"
    assert str(torch.ones(2).to("cuda:1").device) == "cuda:1"


def test_a_non_blocking_copy_to_another_device_lands_there(two_devices):
    x = torch.ones(2, device="cuda:1")
    for moved in (x.to(device=torch.device("cuda", 0), non_blocking=True),
                  x.to("cuda:0", non_blocking=True), x.to("cuda:0", torch.float16, True)):
        assert str(moved.device) == "cuda:0" and not moved.is_pinned()
        assert moved.tolist() == [1.0, 1.0]


def test_an_index_beyond_the_devices_raises_cudas_invalid_device_ordinal(two_devices):
    for call in (lambda: torch.ones(1, device="cuda:2"), lambda: torch.cuda.set_device(2),
                 lambda: torch.ones(1).to("cuda:2")):
        with pytest.raises(RuntimeError, match="CUDA error: invalid device ordinal"):
            call()


def test_torch_load_restores_onto_the_device_its_location_names(two_devices):
    saved = io.BytesIO()
    torch.save({"w": torch.arange(4.0)}, saved)
    for where, index in (("cuda:1", 1), (torch.device("cuda", 1), 1), ({"cpu": "cuda:1"}, 1), ("cuda:0", 0)):
        w = torch.load(io.BytesIO(saved.getvalue()), map_location=where)["w"]
        assert str(w.device) == f"cuda:{index}", where
        assert w.tolist() == [0.0, 1.0, 2.0, 3.0]
    with torch.cuda.device(1):
        assert str(torch.load(io.BytesIO(saved.getvalue()), map_location="cuda")["w"].device) == "cuda:1"


def test_a_checkpoint_saved_from_the_second_device_loads_back_onto_it(two_devices):
    saved = io.BytesIO()
    torch.save(torch.full((2,), 5.0, device="cuda:1"), saved)
    back = torch.load(io.BytesIO(saved.getvalue()))
    assert str(back.device) == "cuda:1" and back.tolist() == [5.0, 5.0]


def test_a_copy_to_cuda_without_an_index_goes_to_the_callers_device(two_devices):
    """ATen's `_to_copy` takes no guard of its input's device, so `.cuda()` and `.to("cuda")` of a
    tensor on cuda:0 inside `torch.cuda.device(1)` copy it to cuda:1 (PyTorch's
    test_cuda_multigpu.py `test_autogpu`, `test_copy_device`); the emulated device ran the copy
    under its input's device and handed the tensor back (until 2026-12-06)."""
    y = torch.ones(2, device="cuda:0")
    with torch.cuda.device(1):
        assert y.cuda().get_device() == 1
        assert y.to("cuda").get_device() == 1
        assert y.to(torch.device("cuda"), torch.float64).get_device() == 1
        assert y.cuda(0) is y and y.to("cuda:0") is y
        assert y.to(torch.float64).get_device() == 0
