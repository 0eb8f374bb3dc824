"""How far a random op moves a CUDA generator's Philox offset: PyTorch's CUDA kernels' rules.

Each CUDA random kernel asks its generator for `philox_cuda_state(increment)`, the increment being
what each thread may consume, rounded up to a multiple of 4 (CUDAGeneratorState::increase).

- The TensorIterator distributions (uniform_, normal_, rand, randn, bernoulli_ with a scalar p,
  exponential_, cauchy_, log_normal_, geometric_, random_, randint) launch
  `calc_execution_policy(numel, unroll)` (cuda/DistributionTemplates.h): blocks of 256 threads, a
  grid of min(SMs * maxThreadsPerSM / 256, ceil(numel / 256)) blocks, and an increment of
  `((numel - 1) // (256 * grid * unroll) + 1) * 4`; unroll is 4 (float4 or uint4 from one curand
  call) but 2 for double (double2) and for 64-bit integers (a 64-bit range or int64/double
  random_). An empty tensor launches nothing and moves nothing. The fused dropout (cuda/Dropout.cu)
  and rrelu's noise use the same rule with unroll 4.
- Fixed increments: bernoulli_ with a tensor of probabilities 10 (12 once rounded), poisson 20,
  _standard_gamma and _sample_dirichlet 10 (12), binomial 42 (44) (cuda/Distributions.cu).
- multinomial with replacement and more than one sample: `((rows - 1) // min(rows, 65535) + 1) *
  4` (cuda/MultinomialKernel.cu); without replacement, or one sample, it draws exponential_ over
  the probabilities, the distribution rule.

- randperm: its random_ keys (int32 while the key bits fit 32, else int64), then n rounded up to 4
  for the shuffle of equal keys (cuda/Randperm.cu, Randperm.cuh).

What differs from CUDA: the grid depends on the SM count and the threads an SM holds; the emulated
device takes its `multi_processor_count` and sm_90's 2048 threads; an op this table does not know
moves the offset by the distribution rule over its output (docs/fidelity.md).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from harness.torch_internals import tree_flatten

_BLOCK = 256
_THREADS_PER_SM = 2048  # sm_90 (and sm_80): maxThreadsPerMultiProcessor
_MAX_GRID_Y = 65535
_FIXED = {"bernoulli_tensor": 10, "poisson": 20, "_standard_gamma": 10, "_sample_dirichlet": 10,
          "binomial": 42}
_WIDE = (torch.float64, torch.int64, torch.uint64)


def distribution_increment(numel: int, unroll: int, sm_count: int) -> int:
    """calc_execution_policy's counter_offset."""
    if numel <= 0:
        return 0
    grid = min(sm_count * (_THREADS_PER_SM // _BLOCK), (numel + _BLOCK - 1) // _BLOCK)
    return ((numel - 1) // (_BLOCK * grid * unroll) + 1) * 4


def increment(func: Any, args: tuple, kwargs: dict, out: Any, sm_count: int) -> int:
    """The increment of aten op `func` called with (args, kwargs), which gave `out`."""
    name = func.__name__.split(".")[0] if hasattr(func, "__name__") else str(func)
    overload = getattr(func, "_overloadname", "")
    base = name.rstrip("_")
    result = _first_tensor(out) if out is not None else None
    if result is None:
        result = _first_tensor((args, kwargs))
    numel = result.numel() if result is not None else 0
    dtype = result.dtype if result is not None else torch.float32
    if base == "bernoulli" and _tensor_probabilities(overload, args, kwargs):
        return _fixed("bernoulli_tensor")
    if base in _FIXED:
        return _fixed(base)
    if base == "multinomial":
        return _multinomial(args, kwargs, sm_count)
    if base == "random" or base == "randint":
        return distribution_increment(numel, _random_unroll(overload, args, kwargs, dtype, base),
                                      sm_count)
    if base == "randperm":
        return _randperm(numel, sm_count)
    if base in ("native_dropout", "_fused_dropout", "rrelu_with_noise"):
        if base == "native_dropout" and _dropout_is_skipped(args, kwargs):
            return 0
        return distribution_increment(numel, 4, sm_count)
    return distribution_increment(numel, 2 if dtype == torch.float64 else 4, sm_count)


def _randperm(n: int, sm_count: int) -> int:
    """Randperm.cu: random_ keys (int32 where `bits` fit 32, drawn four to a thread, else int64,
    two), then randperm_handle_duplicate_keys's philox_cuda_state(n), n rounded up to 4."""
    if n <= 0:
        return 0
    bits = min(64, math.ceil(math.log2(n - (6 * n * n + 1) / (math.log(0.9) * 12))))
    return distribution_increment(n, 4 if bits <= 32 else 2, sm_count) + (n + 3) // 4 * 4


def _fixed(name: str) -> int:
    return (_FIXED[name] + 3) // 4 * 4


def _first_tensor(tree: Any) -> torch.Tensor | None:
    for leaf in tree_flatten(tree)[0]:
        if isinstance(leaf, torch.Tensor):
            return leaf
    return None


def _tensor_probabilities(overload: str, args: tuple, kwargs: dict) -> bool:
    """bernoulli(self) and bernoulli_(self, Tensor p): the per-element kernel; bernoulli_(self,
    float p) and bernoulli(self, float p) are the scalar distribution."""
    if overload in ("float", "p"):
        return False
    p = args[1] if len(args) > 1 else kwargs.get("p")
    return p is None or isinstance(p, torch.Tensor)


def _random_unroll(overload: str, args: tuple, kwargs: dict, dtype: torch.dtype, base: str) -> int:
    if base == "randint":
        low, high = _randint_bounds(args, kwargs)
        return 2 if high - low >= 1 << 28 else 4
    if overload in ("", "default"):
        return 2 if dtype in _WIDE else 4
    low = args[1] if len(args) > 1 else kwargs.get("from", 0)
    high = args[2] if len(args) > 2 else kwargs.get("to")
    if overload == "to":  # random_(to): from 0
        low, high = 0, args[1] if len(args) > 1 else kwargs.get("to")
    if high is None:
        if dtype.is_floating_point or dtype == torch.bool:
            return 2 if dtype in _WIDE else 4
        return 2 if torch.iinfo(dtype).max + 1 - int(low) >= 1 << 28 else 4
    return 2 if int(high) - int(low) >= 1 << 28 else 4


def _randint_bounds(args: tuple, kwargs: dict) -> tuple[int, int]:
    ints = [a for a in args if isinstance(a, int) and not isinstance(a, bool)]
    if "low" in kwargs or "high" in kwargs:
        return int(kwargs.get("low", 0)), int(kwargs.get("high", 0))
    if len(ints) >= 2 and not isinstance(args[1], (list, tuple)):
        return ints[0], ints[1]
    return 0, ints[0] if ints else 0


def _multinomial(args: tuple, kwargs: dict, sm_count: int) -> int:
    probabilities = args[0]
    samples = args[1] if len(args) > 1 else kwargs.get("num_samples", 1)
    replacement = args[2] if len(args) > 2 else kwargs.get("replacement", False)
    if not replacement or samples == 1:
        unroll = 2 if probabilities.dtype == torch.float64 else 4
        return distribution_increment(probabilities.numel(), unroll, sm_count)
    rows = 1 if probabilities.dim() == 1 else probabilities.shape[0]
    return ((rows - 1) // min(rows, _MAX_GRID_Y) + 1) * 4


def _dropout_is_skipped(args: tuple, kwargs: dict) -> bool:
    """native_dropout's short-cuts: train=False, p == 1 (no draw on CUDA)."""
    p = args[1] if len(args) > 1 else kwargs.get("p")
    train = args[2] if len(args) > 2 else kwargs.get("train")
    return train is False or p == 1
