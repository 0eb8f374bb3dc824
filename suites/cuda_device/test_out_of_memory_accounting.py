"""What CUDA's caching allocator does before it raises an out-of-memory error: it counts the
refusal in `memory_stats()["num_ooms"]` and calls the observers attached with
`torch._C._cuda_attach_out_of_memory_observer` (PyTorch's memory notes take a snapshot there) with
the device, the bytes it would reserve, the memory allowed (the device's total without a memory
fraction) and the free bytes. The emulated device reported no refusal, and had no such hook."""

from __future__ import annotations

import pytest
import torch

TOO_MANY_FLOATS = 1 << 45  # 128 TiB: more than any device has


def _refused_allocation() -> torch.OutOfMemoryError:
    with pytest.raises(torch.OutOfMemoryError) as refused:
        torch.empty(TOO_MANY_FLOATS, device="cuda")
    return refused.value


def test_a_refused_allocation_counts_in_num_ooms(cuda_kind):
    before = torch.cuda.memory_stats()["num_ooms"]
    _refused_allocation()
    _refused_allocation()
    assert torch.cuda.memory_stats()["num_ooms"] == before + 2
    torch.cuda.reset_accumulated_memory_stats()
    assert torch.cuda.memory_stats()["num_ooms"] == 0


def test_an_out_of_memory_observer_hears_the_refusal_before_the_error(cuda_kind):
    heard: list[tuple] = []

    def observer(device, alloc, allowed, free) -> None:
        heard.append((device, alloc, allowed, free, torch.cuda.memory_stats()["num_ooms"]))

    torch._C._cuda_attach_out_of_memory_observer(observer)
    before = torch.cuda.memory_stats()["num_ooms"]
    _refused_allocation()
    total = torch.cuda.mem_get_info()[1]
    assert len(heard) == 1, heard
    device, alloc, allowed, free, counted = heard[0]
    assert (device, alloc, allowed) == (0, TOO_MANY_FLOATS * 4, total)
    assert 0 <= free <= total
    assert counted == before + 1  # counted before the observers are told


def test_the_refusal_says_what_the_process_holds_in_cudas_words(cuda_kind):
    """CUDA's text goes on past the device's capacity: the memory PyTorch holds allocated and
    cached, and the allocator setting that fights fragmentation (the emulated device stopped at
    the free bytes)."""
    kept = torch.ones(1 << 20, device="cuda")
    text = str(_refused_allocation())
    assert text.startswith("CUDA out of memory. Tried to allocate 131072.00 GiB. GPU 0"), text
    assert "Of the allocated memory" in text and "is allocated by PyTorch" in text, text
    assert "is reserved by PyTorch but unallocated." in text, text
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in text, text
    del kept
