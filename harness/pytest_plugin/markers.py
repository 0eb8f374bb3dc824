"""The harness's markers: `harness_gpu`, `harness_slow`, `harness_multirank`, `harness_property` in
every session (its own namespace), and the short names `gpu`, `slow`, `multirank`, `property` only in
a project that opted in with `capture_harness = true`. A foreign project's own `slow` or `gpu`
markers are its own: the harness neither registers them nor acts on them there.
"""

from __future__ import annotations

import pytest

DESCRIPTIONS = {
    "gpu": "needs CUDA; skipped with a reason where torch.cuda.is_available() is False",
    "multirank": "spawns several torch.distributed processes",
    "slow": "too long for pre-merge; runs in the nightly lists",
    "property": "Hypothesis property test (profile: --hypothesis-profile ci|nightly|repro)",
}
PREFIX = "harness_"
HARNESS_MARKERS = {PREFIX + name: text for name, text in DESCRIPTIONS.items()}


def register(config: pytest.Config, *, opted_in: bool) -> None:
    for name, text in HARNESS_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    if opted_in:
        for name, text in DESCRIPTIONS.items():
            config.addinivalue_line("markers", f"{name}: {text} (short for {PREFIX}{name})")


def names(*, opted_in: bool) -> tuple[str, ...]:
    """The marker names the harness acts on in this session."""
    return (*HARNESS_MARKERS, *(DESCRIPTIONS if opted_in else ()))


def has(item: pytest.Item, marker: str, *, opted_in: bool) -> bool:
    """`item` carries the harness marker `marker` (short name), under either of its names here."""
    return (item.get_closest_marker(PREFIX + marker) is not None
            or (opted_in and item.get_closest_marker(marker) is not None))


def carries_any(item: pytest.Item, *, opted_in: bool) -> bool:
    return any(item.get_closest_marker(name) is not None for name in names(opted_in=opted_in))


def skip_without_cuda(items: list[pytest.Item], *, opted_in: bool, cuda_available) -> int:
    """Skip the tests marked gpu where there is no CUDA; how many were skipped. `cuda_available`
    is called only when some test needs it (it imports torch)."""
    needs_cuda = [item for item in items if has(item, "gpu", opted_in=opted_in)]
    if not needs_cuda or cuda_available():
        return 0
    skip = pytest.mark.skip(reason="needs CUDA: torch.cuda.is_available() is False")
    for item in needs_cuda:
        item.add_marker(skip)
    return len(needs_cuda)
