"""`F.one_hot(ids, num_classes)` on the device takes CUDA's path (Onehot.cpp): it reads nothing on
the host (no sync), checks only `num_classes >= 1` ("num_classes should be positive") and leaves a
class value outside [0, num_classes) to scatter's device-side assert. The CPU's path reads the
input's minimum and maximum with `.item()` and raises "Class values must be non-negative." or
"... smaller than num_classes.", and the emulated device took it: a MoE router's padded expert id
of -1 raised the CPU's RuntimeError eagerly where CUDA fails the kernel (a padded row routed by
`one_hot` is a bug CUDA reports as a device assert). Without `num_classes` both read the maximum,
a sync a capture refuses. The `cuda_kind` rows show CUDA's answer on a GPU; the bad class value
natively in a process of its own, since the assert leaves the context unusable."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from suites.cuda_device._own_process import in_a_process_of_its_own

DEVICE_ASSERT = "CUDA error: device-side assert triggered"
NOT_PERMITTED = "operation not permitted when stream is capturing"


def test_one_hot_with_num_classes_makes_no_sync(cuda_kind):
    ids = torch.tensor([[0, 3], [2, 1]], device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = F.one_hot(ids, 4)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert out.is_cuda and out.dtype == torch.long and out.shape == (2, 2, 4)
    assert out.argmax(-1).cpu().tolist() == [[0, 3], [2, 1]]


def _bad_class_value(value: int) -> tuple[bool, str]:
    """Whether CUDA's error class was raised (the emulated one is a subclass), and its first line."""
    ids = torch.tensor([value, 1], device="cuda")
    try:
        F.one_hot(ids, 4)
        torch.cuda.synchronize()
    except Exception as error:  # noqa: BLE001 - its class is the outcome under test
        return isinstance(error, torch.AcceleratorError), (str(error).splitlines() or [""])[0]
    return False, "no error"


@pytest.mark.parametrize("value", [-1, 4], ids=["padding id -1", "num_classes"])
def test_a_class_value_out_of_range_is_scatters_device_assert(cuda_kind, value):
    if cuda_kind == "sanitizer":
        pytest.skip("the sanitizer runs CUDA's kernel: its assert, as natively")
    if cuda_kind == "native":
        accelerator_error, first_line = in_a_process_of_its_own(__file__, "_bad_class_value", value)
    else:
        accelerator_error, first_line = _bad_class_value(value)
    assert accelerator_error and first_line == DEVICE_ASSERT, first_line


def test_num_classes_below_one_is_refused_on_the_host(cuda_kind):
    with pytest.raises(RuntimeError, match="num_classes should be positive"):
        F.one_hot(torch.tensor([0, 0], device="cuda"), 0)


def test_one_hot_with_num_classes_captures_and_follows_new_ids(cuda_kind):
    ids = torch.tensor([0, 3], device="cuda")
    F.one_hot(ids, 4)  # warmup
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = F.one_hot(ids, 4)
    ids.copy_(torch.tensor([2, 1]))
    graph.replay()
    torch.cuda.synchronize()
    assert out.argmax(-1).cpu().tolist() == [2, 1]


def test_host_ids_keep_the_cpus_checks(cuda_kind):
    with pytest.raises(RuntimeError, match="Class values must be non-negative"):
        F.one_hot(torch.tensor([-1, 1]), 4)
