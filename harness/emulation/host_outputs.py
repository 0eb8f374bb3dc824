"""Aten ops whose outputs CUDA makes in host memory though their inputs are device memory.

A packed sequence keeps its batch sizes on the host: `_pack_padded_sequence` makes them with the
options of its host `lengths` (PackedSequence.cpp: `at::empty(lengths[0], _lengths.options())`,
filled by a host loop) beside the device data it concatenates, and `_pad_packed_sequence` makes
the lengths it returns with the options of those host batch sizes (`at::empty(max_batch_size,
batch_sizes_t.options())`) beside its device output. Both are ready when the call returns: the
host computes them, no kernel does.

Every part of the emulated device that marks a device call's results device memory asks here
first: the placement mode (the torch call), the stream tracking (the aten op as dispatched; a call
whose op has host outputs is never learned as a call pattern, whose one result is noted device
memory), the view a user's dispatch mode is given, and the saved-tensor pack hook (activation
checkpointing's hooks meet the op's node, which saves the batch sizes). The stream tracking also
never queues such an op under the adversarial schedule: what it makes on the host is there when
the call returns.

`_pack_padded_sequence` reaches the dispatch modes whole (CompositeExplicitAutograd), so they know
its host output by position. `_pad_packed_sequence` is CompositeImplicitAutograd: with autograd on
the modes meet only the ops its kernel runs, and on the emulated device its host `empty` names the
cpu as its device `full` does. So while the placement mode runs a call listed here, the device's
memory holds its entry (`makes_host_memory` asks it of a factory), and the modes leave that
factory's result host memory.

Nested tensors keep their sizes and strides on the host too (`_nested_tensor_size`), but the
emulated device makes no nested tensor, so they are not listed; nor are the scalars an op hands
back to Python (`_local_scalar_dense`), which are no memory at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness import torch_internals


@dataclass(frozen=True)
class HostOutputs:
    """Which outputs of an aten op are host memory, and, for an op the dispatch modes meet only
    decomposed, the aten factory its kernel makes them with."""

    positions: tuple[int, ...]
    factory: Any = None


_PACKED = HostOutputs((1,))
_PADDED = HostOutputs((1,), torch.ops.aten.empty.memory_format)
_BY_NAME: dict[str, HostOutputs] = {"aten::_pack_padded_sequence": _PACKED,
                                    "aten::_pad_packed_sequence": _PADDED}
# The torch calls that are exactly one of those ops (what the placement mode sees): torch._VF's
# function, which torch.nn.utils.rnn calls, and the op called through torch.ops
_BY_CALL: dict[Any, HostOutputs] = {
    torch_internals.pack_padded_sequence_call: _PACKED,
    torch.ops.aten._pack_padded_sequence: _PACKED,
    torch.ops.aten._pack_padded_sequence.default: _PACKED,
    torch_internals.pad_packed_sequence_call: _PADDED,
    torch.ops.aten._pad_packed_sequence: _PADDED,
    torch.ops.aten._pad_packed_sequence.default: _PADDED,
}
CALLS = frozenset(_BY_CALL)
# The calls of the pack, whose lengths CUDA wants on the host (host_arguments.py)
PACKING_CALLS = frozenset(call for call, host in _BY_CALL.items() if host is _PACKED)


def of_op(func: Any) -> HostOutputs | None:
    """The host outputs of the aten op `func` (an OpOverload), None for an op without any."""
    return _BY_NAME.get(func.name())


# of_call(func): the host outputs of the torch call `func`, None for a call without any. The
# table's own `get`: the placement mode asks it for every device call, and it needs no frame.
of_call = _BY_CALL.get


def device_outputs(out: Any, host: HostOutputs | None) -> Any:
    """The outputs of a device call the device made, `out` itself for a call without host ones."""
    if host is None or not isinstance(out, (tuple, list)):
        return out
    return tuple(o for i, o in enumerate(out) if i not in host.positions)


__all__ = ["CALLS", "PACKING_CALLS", "HostOutputs", "device_outputs", "of_call", "of_op"]
