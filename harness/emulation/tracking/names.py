"""Labels for race reports: every tensor reachable from an object, by its path (the paths of
`harness.graphs.pointers`), keyed by its storage's data pointer as the tracker keys storages."""

from __future__ import annotations

from typing import Any

import torch

from harness.graphs.pointers import tensor_refs
from harness.emulation.tracking.races import TensorLabel


def storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def label_of(tensor: torch.Tensor, path: str = "") -> TensorLabel:
    return TensorLabel(tuple(tensor.shape), str(tensor.dtype), path)


class ShapeLabels:
    """`label_of(t)` (no path) shared by every tensor of one shape and dtype: the stream mode
    labels each result it sees, a few dozen shapes over and over, and a label is immutable."""

    BOUND = 4096  # distinct (shape, dtype) pairs kept; past it the cache starts again

    def __init__(self) -> None:
        self._known: dict[tuple, TensorLabel] = {}

    def of(self, tensor: torch.Tensor) -> TensorLabel:
        key = (tensor.shape, tensor.dtype)
        label = self._known.get(key)
        if label is None:
            if len(self._known) >= self.BOUND:
                self._known.clear()
            label = self._known[key] = label_of(tensor)
        return label


def name_tensors(obj: Any, root: str = "") -> dict[int, TensorLabel]:
    """A label for each storage reachable from `obj`; the first path found names a shared one."""
    labels: dict[int, TensorLabel] = {}
    for path, ref in tensor_refs(obj, root).items():
        tensor = ref()
        if tensor is None or tensor.layout != torch.strided:
            continue
        labels.setdefault(storage_key(tensor), label_of(tensor, path))
    return labels
