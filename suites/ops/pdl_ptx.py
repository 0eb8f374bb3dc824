"""Ahead-of-time PTX of the project's Triton decode kernels for an sm_90 target, with and without
PDL, compiled without a GPU (`triton.compile` of an `ASTSource` for `GPUTarget("cuda", 90, 32)`).

Each case gives a kernel's argument types (pointers by element type, ints, floats) and its
constexprs at the 1B shapes (batch 1); `kernel_ptx(case, pdl)` returns the PTX text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

SM90 = ("cuda", 90, 32)


@dataclass(frozen=True)
class KernelCase:
    """`kernel(module)` picks the JIT function out of its module (imported on use, since the
    modules import triton); `pointers` maps pointer arguments to their element type (the rest of
    the non-constexpr arguments are i32, `floats` fp32); `constants` the constexprs (a stride
    of 1 among them, as the launcher specialises it at run time)."""

    name: str
    module: str
    kernel: str
    pointers: dict[str, str]
    constants: dict[str, Any]
    floats: tuple[str, ...] = ()
    num_warps: int = 4
    options: dict[str, Any] = field(default_factory=dict)
    aligned: tuple[str, ...] = ()  # arguments divisible by 16, as the launcher specialises them


_GEMV_POINTERS = {"x_ptr": "bf16", "w_ptr": "bf16", "bias_ptr": "bf16", "res_ptr": "bf16",
                  "norm_ptr": "bf16", "out_ptr": "bf16", "part_ptr": "fp32"}
_GEMV_FLAGS = dict(HAS_BIAS=False, SPLIT=False, BLOCK_M=1)

CASES = (
    KernelCase("qkv norm_gemv", "harness.ops.triton_gemv", "_gemv_kernel", _GEMV_POINTERS,
               dict(_GEMV_FLAGS, HAS_NORM=True, HAS_RESIDUAL=False, GATED=False, BLOCK_N=8,
                    BLOCK_K=1024), floats=("eps",)),
    KernelCase("down gemv_residual split", "harness.ops.triton_gemv", "_gemv_kernel",
               _GEMV_POINTERS, dict(_GEMV_FLAGS, HAS_NORM=False, HAS_RESIDUAL=True, GATED=False,
                                    SPLIT=True, BLOCK_N=8, BLOCK_K=1024), floats=("eps",)),
    KernelCase("gate_up norm_gemv_silu_mul", "harness.ops.triton_gemv", "_gemv_kernel",
               _GEMV_POINTERS, dict(_GEMV_FLAGS, HAS_NORM=True, HAS_RESIDUAL=False, GATED=True,
                                    BLOCK_N=16, BLOCK_K=512), floats=("eps",)),
    KernelCase("gate_up tensor cores", "harness.ops.triton_gemv", "_gemv_mma_kernel",
               _GEMV_POINTERS, dict(_GEMV_FLAGS, HAS_NORM=True, HAS_RESIDUAL=False, GATED=True,
                                    BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, INTERPRETED=False,
                                    PREFETCH_K=512, stride_xk=1, stride_wk=1),
               floats=("eps",), num_warps=8, options=dict(num_stages=6),
               aligned=("x_ptr", "w_ptr", "norm_ptr", "out_ptr", "K", "N", "stride_xm",
                        "stride_wn", "stride_om", "up_offset", "k_per_split")),
    KernelCase("gemv split sum", "harness.ops.triton_gemv", "_split_sum_kernel",
               {"part_ptr": "fp32", "bias_ptr": "bf16", "res_ptr": "bf16", "out_ptr": "bf16"},
               dict(SPLIT_K=2, HAS_BIAS=False, HAS_RESIDUAL=True, BLOCK_M=1, BLOCK_N=256)),
    KernelCase("paged decode split", "harness.ops.triton_decode", "_paged_decode_split_kernel",
               {"q_ptr": "bf16", "kv_ptr": "bf16", "out_ptr": "bf16", "part_ptr": "fp32",
                "positions_ptr": "i64", "token_to_seq_ptr": "i64", "seq_lens_ptr": "i32",
                "block_tables_ptr": "i64"},
               dict(GROUP=4, HEAD_DIM=64, BLOCK_SIZE=16, TILE=32, NUM_SPLITS=32, PADDED_GROUP=4,
                    PADDED_DIM=64), floats=("scale",)),
    KernelCase("paged decode combine", "harness.ops.triton_decode", "_paged_decode_combine_kernel",
               {"out_ptr": "bf16", "part_ptr": "fp32", "positions_ptr": "i64",
                "token_to_seq_ptr": "i64", "seq_lens_ptr": "i32"},
               dict(GROUP=4, HEAD_DIM=64, TILE=32, NUM_SPLITS=32, PADDED_GROUP=4, PADDED_DIM=64,
                    PADDED_SPLITS=32)),
    KernelCase("rope + KV write", "harness.ops.triton_rope_kv", "_rope_kv_write_kernel",
               {"q_ptr": "bf16", "k_ptr": "bf16", "v_ptr": "bf16", "cos_ptr": "bf16",
                "sin_ptr": "bf16", "kv_ptr": "bf16", "slot_mapping_ptr": "i64"},
               dict(HEADS=32, KV_HEADS=8, HEAD_DIM=64, BLOCK_SIZE=16, PADDED_HEADS=32,
                    PADDED_KV_HEADS=8, PADDED_DIM=64)),
    KernelCase("greedy ranking chunks", "harness.ops.triton_greedy", "_chunk_kernel",
               {"logits_ptr": "bf16", "key_ptr": "i32", "index_ptr": "i32", "abs_ptr": "i32",
                "max_ptr": "fp32", "sum_ptr": "fp32"}, dict(CHUNK_SIZE=4096), num_warps=8),
    KernelCase("greedy ranking combine", "harness.ops.triton_greedy", "_combine_kernel",
               {"key_ptr": "i32", "index_ptr": "i32", "abs_ptr": "i32", "max_ptr": "fp32",
                "sum_ptr": "fp32", "values_ptr": "fp32", "tokens_ptr": "i64"},
               dict(BLOCK_CHUNKS=32), num_warps=1),
)


def kernel_ptx(case: KernelCase, pdl: bool) -> str:
    """The PTX triton makes of `case` for sm_90, with USE_PDL as `pdl`."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(case.module), case.kernel)
    constants = dict(case.constants)
    if pdl or "USE_PDL" in fn.arg_names:  # a kernel without the flag: its PTX before PDL
        constants["USE_PDL"] = pdl
    signature = {}
    for name in fn.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        elif name in case.pointers:
            signature[name] = f"*{case.pointers[name]}"
        else:
            signature[name] = "fp32" if name in case.floats else "i32"
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in case.aligned}
    source = ASTSource(fn, signature, constexprs=constants, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget(*SM90),
                              options=dict(case.options, num_warps=case.num_warps,
                                           launch_pdl=pdl))
    return compiled.asm["ptx"]


def instruction_count(ptx: str) -> int:
    """Lines of the PTX body that are instructions (a rough size of the kernel)."""
    count = 0
    for line in ptx.splitlines():
        line = line.strip()
        if line and not line.startswith(("//", ".", "{", "}", "$")) and line.endswith(";"):
            count += 1
    return count


def with_each_case(fn: Callable[[KernelCase], Any]) -> dict[str, Any]:
    return {case.name: fn(case) for case in CASES}
