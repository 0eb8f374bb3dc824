"""How torch.cuda's functions read a device argument on the emulated device, as CUDA's torch reads
it: a name is a device (`"cpu"` is refused as `torch.device("cpu")` is), and torch.load refuses a
checkpoint's device index the machine lacks with torch.serialization's own text. The `cuda_kind`
rows run natively on a GPU to show CUDA's answer."""

from __future__ import annotations

import io

import pytest
import torch


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_synchronize_refuses_a_cpu_device_by_name_or_object(cuda_kind, device):
    """torch.cuda's _get_device_index reads a str as a torch.device; the emulated device checked
    the type of a torch.device only, and synchronized for "cpu" (until 2026-12-06; PyTorch's
    test_cuda_multigpu.py `test_cuda_synchronize`)."""
    with pytest.raises(ValueError, match="Expected a cuda device, but got: cpu"):
        torch.cuda.synchronize(device)


def test_loading_onto_a_device_the_machine_lacks_is_refused_in_torchs_words(cuda_kind):
    """torch.serialization validates the saved location's index against device_count() before it
    restores; the emulated device raised its own invalid-ordinal error (until 2026-12-06;
    PyTorch's test_cuda_multigpu.py `test_load_nonexistent_device`)."""
    missing = torch.cuda.device_count()
    buffer = io.BytesIO()
    torch.save(torch.ones(2, device="cuda"), buffer)
    saved = io.BytesIO(buffer.getvalue().replace(b"cuda:0", f"cuda:{missing}".encode()))
    with pytest.raises(RuntimeError, match=f"Attempting to deserialize object on CUDA device "
                                           f"{missing} but torch.cuda.device_count\\(\\) is "
                                           f"{missing}"):
        torch.load(saved)


def test_a_device_context_object_names_its_device(cuda_kind):
    """torch.cuda's _get_device_index reads a `torch.cuda.device` object as its index: PyTorch's
    test_cuda_multigpu.py `test_external_streams` passes one to get_stream_from_external (a
    TypeError on the emulated device until 2026-12-06)."""
    context = torch.cuda.device(0)
    assert torch.cuda.get_stream_from_external(0, context) == torch.cuda.default_stream(0)
    assert torch.cuda.current_stream(context) == torch.cuda.current_stream(0)
