"""torch's grouping of tensor lists by device and dtype (`torch._C._group_tensors_by_device_and_dtype`,
what foreach and fused optimizers use) keyed by the emulated device.

The C++ grouping reads each tensor's real device, the host's, so on the emulated device a fused
optimizer's `grad_scale.to(device, non_blocking=True)` became a copy to pageable host memory and
was refused during capture, where CUDA groups by `cuda:N` and the copy is a no-op."""

from __future__ import annotations

from typing import Any

import torch

from harness import torch_internals


def patches(state) -> list[tuple[Any, str, Any]]:
    group = torch_internals.group_tensors_by_device_and_dtype

    def grouped_by_emulated_device(tensorlistlist, with_indices=False):
        out: dict = {}
        for (device, dtype), (lists, indices) in group(tensorlistlist, with_indices).items():
            # One host group may hold device memory and host tensors alike; CUDA keeps them apart.
            keyed: dict = {}
            for j, t in enumerate(lists[0]):
                key = t.device if t is not None and state.memory.is_device(t) else device
                keyed.setdefault(key, []).append(j)
            for key, positions in keyed.items():
                sub = [[tensors[j] for j in positions] if tensors else tensors for tensors in lists]
                out[(key, dtype)] = (sub, [indices[j] for j in positions] if indices else indices)
        return out

    return [(torch_internals.torch_namespace("torch._C"), "_group_tensors_by_device_and_dtype",
             grouped_by_emulated_device)]


__all__ = ["patches"]
