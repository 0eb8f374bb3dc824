"""Every factory that takes a device reaches the placement mode while dynamo traces.

Dynamo hands a torch function mode only the calls in its `get_overridable_functions()`. From
torch 2.12 on that set holds every device constructor (`torch.utils._device._device_constructors`:
`arange`, `randn`, `full`, ...); torch 2.11 adds only `ones`, `zeros`, `empty` and `full`. There,
`torch.arange(n, device="cuda")` in compiled code (transformers' static cache computes its
`cache_position` so) went into the graph naming cuda, and building its fake tensor failed with
"Found no NVIDIA driver" on a CUDA wheel without a GPU. While the emulation is active the set also
holds the device constructors, as in later torch, so placement.py traces each on the cpu.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from harness import torch_internals


def factories_patch() -> list[tuple[Any, str, Any]]:
    """The (owner, name, replacement) entry for dynamo's set, or none where it holds them all."""
    variables = torch_internals.lazy_module("dynamo_torch_variables")
    original = getattr(variables, "get_overridable_functions", None)
    if original is None:
        return []
    constructors = frozenset(torch_internals.device_constructors())
    if constructors <= original():
        return []
    return [(variables, "get_overridable_functions", _with_constructors(original, constructors))]


def _with_constructors(original: Callable[[], set], constructors: frozenset) -> Callable[[], set]:
    @functools.cache
    def get_overridable_functions() -> set:
        return set(original()) | constructors

    return get_overridable_functions
