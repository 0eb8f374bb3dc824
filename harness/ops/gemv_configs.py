"""Launch configurations of the decode GEMV kernels (`triton_gemv.py`), chosen from the shapes alone.

A capture must never benchmark, so there is no autotuning: `choose_gemv_config` is a small
heuristic over (M, N, K, the device's SM count), the same shapes always giving the same config
and so the same reduction order (deterministic results). `scripts/decode_linear_bench.py` times
candidate configs on the 1B shapes so that the heuristic's numbers can be set from measurements;
a caller may also pass a config of its own (the benchmark does).

The idea of the heuristic: a batch-1 GEMV is a read of the weight matrix, so enough programs must
be in flight to keep HBM busy (a few per SM), each streaming whole rows of W in wide tiles.
Output rows are split into blocks of `block_n`; when that leaves too few programs (a narrow N, a
long K: down_proj), K is split across `split_k` programs whose fp32 partial sums a second kernel
adds in a fixed order (no atomics).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

# Programs per SM the heuristic aims for: a GEMV program waits on memory most of its life.
PROGRAMS_PER_SM = 2
DEFAULT_SM_COUNT = 132  # an H200; used where the tensors are not on a CUDA device (the interpreter)
MAX_SPLIT_K = 8
TILE_ELEMENTS = 16384
MMA_MAX_ROWS = 16  # rows of x one tensor-core tile holds


@dataclass(frozen=True)
class GemvConfig:
    """`block_n` output rows per program, `block_k` columns of W per loop step, `num_warps`,
    `split_k` programs sharing one row block's K (1: no split, no second kernel), `mma`: the
    products on tensor cores (x padded to 16 rows, W's tiles streamed through shared memory
    `num_stages` deep by Triton's pipeliner; 16-bit operands only), `prefetch_k`: with PDL, the
    tensor-core kernel first starts copying that many columns of each of its rows of W into L2,
    before it waits for the kernel before it (0: none)."""

    block_n: int
    block_k: int
    num_warps: int = 4
    split_k: int = 1
    mma: bool = False
    num_stages: int = 3
    prefetch_k: int = 0

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k", "num_warps"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"GemvConfig.{name} must be a power of two >= 1, got {value}")
        if not 1 <= self.num_stages <= 8:
            raise ValueError(f"GemvConfig.num_stages must be in [1, 8], got {self.num_stages}")
        if self.prefetch_k < 0 or self.prefetch_k % 8 or (self.prefetch_k and not self.mma):
            raise ValueError(f"GemvConfig.prefetch_k must be a multiple of 8 >= 0, on a tensor-core "
                             f"config only, got {self.prefetch_k} (mma={self.mma})")
        if self.mma and (self.block_n < 16 or self.block_k < 16):
            raise ValueError(f"a tensor-core GemvConfig needs block_n and block_k >= 16, got "
                             f"{self.block_n} and {self.block_k}")
        if not 1 <= self.split_k <= 64:
            raise ValueError(f"GemvConfig.split_k must be in [1, 64], got {self.split_k}")

    def label(self) -> str:
        label = f"n{self.block_n} k{self.block_k} w{self.num_warps} s{self.split_k}"
        if self.mma:
            label += f" mma st{self.num_stages}" + (f" pf{self.prefetch_k}" if self.prefetch_k else "")
        return label


# Six stages and 512 columns of each row prefetched under PDL: 688 us for 16 layers of GEMVs in
# one graph against 689 with four and none; 0.949 and 0.973 ms 1B steps against 0.994 (H200).
GATED_MMA = GemvConfig(block_n=64, block_k=128, num_warps=8, mma=True, num_stages=6,
                       prefetch_k=512)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def block_m(m: int) -> int:
    """Rows of x each program carries (all of them: the kernels serve decode-sized M)."""
    return next_power_of_2(m)


def sm_count(device: torch.device) -> int:
    """The device's SM count (a host-side property: no sync, capture-safe)."""
    if device.type != "cuda":
        return DEFAULT_SM_COUNT
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.lru_cache(maxsize=256)  # a pure function of its arguments, asked at every eager launch
def choose_gemv_config(m: int, n: int, k: int, *, sms: int = DEFAULT_SM_COUNT,
                       rows_per_output: int = 1, tensor_cores: bool = False) -> GemvConfig:
    """The config for y[m, n] = x[m, k] @ W[n * rows_per_output, k]^T (rows_per_output 2: the
    gated kernel reads a gate and an up row per output). Wide K tiles for M = 1, narrower as M
    grows so that the [M, block_n, block_k] product stays in registers. `tensor_cores`: the
    operands are 16-bit, so the tensor-core kernel may be chosen (the gated GEMV of up to
    MMA_MAX_ROWS rows)."""
    if m < 1 or n < 1 or k < 1:
        raise ValueError(f"GEMV shapes must be >= 1, got m={m}, n={n}, k={k}")
    if tensor_cores and rows_per_output == 2 and m <= MMA_MAX_ROWS and n >= GATED_MMA.block_n:
        # gate_up at the 1B shapes on the H200 (decode_linear_bench, docs/benchmarks.md): 20.3 us
        # against 27.2 for the best row-tile config, the pipelined tiles keeping more of W in
        # flight than loads into registers do.
        return GATED_MMA
    bm = block_m(m)
    block_k = min(next_power_of_2(k), max(64, 512 // bm))
    target = PROGRAMS_PER_SM * sms
    # The widest row block that still leaves `target` programs; at least 8 rows (one tile row per
    # warp lane group), at most 128.
    block_n = 128 // rows_per_output
    while block_n > 8 and -(-n // block_n) < target:
        block_n //= 2
    # The [M, block_n, block_k] product of one step stays within TILE_ELEMENTS (registers).
    block_n = min(block_n, max(8, next_power_of_2(n)),
                  max(8, TILE_ELEMENTS // (block_k * bm * rows_per_output)))
    if bm == 1 and rows_per_output == 1 and block_n == 8 and k >= 1024:
        # Narrow row blocks at M = 1 (qkv, o_proj, down): wider K tiles measured 1.2-1.3x faster
        # on the H200 (decode_linear_bench, docs/benchmarks.md).
        block_k = 1024
    programs = -(-n // block_n)
    split_k = 1
    # Split K only when the row blocks alone leave SMs idle and each split keeps several tiles;
    # never for the gated kernel, whose epilogue needs whole sums.
    while (rows_per_output == 1 and programs * split_k < target and split_k < MAX_SPLIT_K
           and k // (2 * split_k) >= 4 * block_k):
        split_k *= 2
    num_warps = 4 if block_n * block_k * bm * rows_per_output <= 8192 else 8
    return GemvConfig(block_n=block_n, block_k=block_k, num_warps=num_warps, split_k=split_k)
