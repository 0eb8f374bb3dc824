"""The random state of an emulated CUDA generator: CUDA's CUDAGeneratorState (a seed and a Philox
offset), its 16-byte `get_state()` layout, and the values a draw takes from it.

A CUDA generator's state is a seed and an offset into the Philox stream, the offset a multiple of
4 that each kernel advances by what it may consume (rng_increments.py). `get_state()` is a uint8
tensor of 16 bytes: the seed as a uint64, then the offset as an int64, both in the machine's byte
order; `set_state()` takes that or the 8-byte seed alone (offset 0), with
CUDAGeneratorImpl::set_state's checks and words. The emulated device's kernels are the cpu's, which
draw from a Mersenne Twister: a draw at (seed, offset) runs the cpu kernel on a scratch cpu
generator seeded from both (`scratch_seed`), so the values are a function of the state alone, as
on CUDA, though not CUDA's values.
"""

from __future__ import annotations

import secrets
import sys

import torch

_MASK = (1 << 64) - 1
_SEED_BYTES = 8
STATE_BYTES = 16
# c10::detail::getNonDeterministicRandom(is_cuda=true): two 32-bit words limited to 53 bits.
_CUDA_RANDOM_SEED_BITS = 53


class PhiloxState:
    """CUDA's CUDAGeneratorState: shared by every generator object that `graphsafe_get_state()`
    hands out, copied by `clone_state()`. Mutable on purpose: CUDA's is one object that each
    holder's draws advance."""

    __slots__ = ("seed", "offset", "capturing", "__weakref__")

    def __init__(self, seed: int, offset: int = 0) -> None:
        self.seed = seed
        self.offset = offset
        # CUDAGeneratorState's capturing_: from a capture's prologue (capture_begin) to its
        # epilogue (capture_end). A capture_begin refused after its prologue (on the default
        # stream) leaves it set, and every eager draw from the state then raises.
        self.capturing = False

    def clone(self) -> "PhiloxState":
        return PhiloxState(self.seed, self.offset)

    def advance(self, increment: int) -> int:
        """The offset a draw uses; the state moves past it by `increment` rounded up to 4
        (CUDAGeneratorState::increase)."""
        used = self.offset
        self.offset = (used + (increment + 3) // 4 * 4) & _MASK
        return used

    def __repr__(self) -> str:
        return f"PhiloxState(seed={self.seed}, offset={self.offset})"


def normalized_seed(seed) -> int:
    """A seed as CUDA's manual_seed stores it (uint64; a negative int is taken as its two's
    complement), with torch's own error for a value out of range or not an int."""
    return torch.Generator().manual_seed(seed).initial_seed()


def nondeterministic_seed() -> int:
    return secrets.randbits(_CUDA_RANDOM_SEED_BITS)


def encode(state: PhiloxState) -> torch.Tensor:
    seed = state.seed.to_bytes(8, sys.byteorder)
    offset = (state.offset & _MASK).to_bytes(8, sys.byteorder)
    return torch.frombuffer(bytearray(seed + offset), dtype=torch.uint8)


def decode(new_state) -> tuple[int, int]:
    """(seed, offset) from a state tensor, with CUDAGeneratorImpl::set_state's checks."""
    if not isinstance(new_state, torch.Tensor):
        raise TypeError(f"expected a torch.ByteTensor, but got {type(new_state).__name__}")
    if (new_state.layout != torch.strided or new_state.device.type != "cpu"
            or new_state.dtype != torch.uint8):
        raise TypeError("RNG state must be a torch.ByteTensor")
    if not new_state.is_contiguous():
        raise RuntimeError("RNG state must be contiguous")
    size = new_state.numel()
    if size not in (_SEED_BYTES, STATE_BYTES):
        raise RuntimeError("RNG state is wrong size")
    raw = bytes(new_state.tolist())
    seed = int.from_bytes(raw[:_SEED_BYTES], sys.byteorder)
    offset = int.from_bytes(raw[_SEED_BYTES:], sys.byteorder) if size == STATE_BYTES else 0
    check_offset(offset)
    return seed, offset


def check_offset(offset: int) -> None:
    if offset % 4 != 0:
        raise RuntimeError("offset must be a multiple of 4")


def scratch_seed(seed: int, offset: int) -> int:
    """The cpu generator's seed for a draw at (seed, offset): splitmix64 of both, so that nearby
    offsets and seeds give unrelated streams."""
    z = (seed ^ ((offset + 1) * 0x9E3779B97F4A7C15)) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)
