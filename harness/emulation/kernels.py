"""Kernels CUDA has and the CPU build of torch lacks, for device tensors: computed from CPU kernels
that exist, with CUDA's result dtype. Code written for CUDA takes these paths when it sees a cuda
device (transformers' grouped MoE counts tokens per expert with an integer `histc`, a router asks
`mm(..., out_dtype=float32)`, an attention layer allows only the memory-efficient SDPA kernel),
and would otherwise fail eagerly where a GPU runs it. Also CUDA's kernels that answer where the
CPU's raise (integer division by zero, with the values the GPU writes).

Each entry is called by the placement mode as `func` of its generic rule, so the outputs are
device memory and a capture records the CPU ops they are made of."""

from __future__ import annotations

import warnings

import torch
from torch.torch_version import TorchVersion

from harness.graphs.emulator.cuda_paths import one_hot_without_sync

Tensor = torch.Tensor


def histc(input: Tensor, bins: int = 100, min: float = 0, max: float = 0, *, out: Tensor | None = None):
    """CUDA's histc takes integer input (the CPU's raises "histogram_cpu" not implemented for
    'Int'); counting in float64 places every int32 value in the bin CUDA places it, and the counts
    come back in the input's dtype, as on CUDA."""
    if input.is_floating_point() or input.is_complex():
        return torch.histc(input, bins, min, max, out=out)
    counts = torch.histc(input.double(), bins, min, max).to(input.dtype)
    return counts if out is None else out.copy_(counts)


def tensor_histc(self: Tensor, bins: int = 100, min: float = 0, max: float = 0) -> Tensor:
    return histc(self, bins, min, max)


def mm(input: Tensor, mat2: Tensor, out_dtype: torch.dtype | None = None, *, out: Tensor | None = None):
    """`mm(a, b, out_dtype=torch.float32)` of reduced-precision inputs (CUDA only: the CPU build has
    no `aten::mm.dtype` kernel): CUDA multiplies in float32 and writes float32; the product of the
    inputs made float32 is that."""
    if out_dtype is None or out_dtype == input.dtype:
        return torch.mm(input, mat2, out=out) if out is not None else torch.mm(input, mat2)
    result = torch.mm(input.to(torch.float32), mat2.to(torch.float32)).to(out_dtype)
    return result if out is None else out.copy_(result)


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, *args, **kwargs):
    """SDPA with CUDA's choice of kernel (sdpa_backends.py). Where the caller switched off the
    math kernel and cuDNN's, and neither fused kernel left takes the inputs on CUDA, CUDA's
    "No available kernel" is raised after its reasons. Otherwise the CPU's kernels stand in for
    the fused one CUDA runs, as every emulated kernel is a CPU kernel: the CPU build has neither
    memory-efficient nor cuDNN attention, and its flash kernel refuses dropout, which CUDA's
    takes, so with only those allowed it would find no kernel where a GPU runs the call. The
    caller's switches are back as they were when the call returns. On a real device nothing
    changes."""
    if query.device.type != "cpu":
        return _sdpa(query, key, value, *args, **kwargs)
    from harness.emulation.sdpa_backends import AttentionCall, refusal_of_the_allowed_kernels

    call = AttentionCall.of_arguments(query, key, value, *args, **kwargs)
    if reasons := refusal_of_the_allowed_kernels(call):
        raise RuntimeError(f"No available kernel. Aborting execution. ({reasons} The CPU's kernels "
                           f"would take the call; CUDA's allowed ones do not.)")
    backends = torch.backends.cuda
    fused_allowed = (backends.flash_sdp_enabled() or backends.mem_efficient_sdp_enabled()
                     or backends.cudnn_sdp_enabled())
    if fused_allowed and not backends.math_sdp_enabled():
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]):
            return _sdpa(query, key, value, *args, **kwargs)
    return _sdpa(query, key, value, *args, **kwargs)


_sdpa = torch.nn.functional.scaled_dot_product_attention


def causal_bias_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask, dropout_p=0.0,
                          is_causal: bool = False, scale=None, enable_gqa: bool = False):
    """SDPA given a `torch.nn.attention.bias.CausalBias` (`causal_lower_right`,
    `causal_upper_left`). Torch's own dispatch of the bias (`CausalBias._dispatch`) hands a
    lower-right bias of unequal lengths to the fused kernels' own ops when
    `can_use_flash_attention` or `can_use_efficient_attention` says so
    (`aten._scaled_dot_product_flash_attention`, `aten._efficient_attention_forward`), which a CPU
    build lacks; what they compute is attention under the lower-right mask, computed here from
    the materialized mask by the CPU's kernels. Where neither fused kernel takes the call, torch
    materializes the mask itself, after the kernels' reasons, and so does this. The bias takes
    the call before autocast sees it: only the SDPA calls torch's dispatch makes again are cast.
    Called with the placement mode pushed again, so that the calls inside are the device's."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import CausalVariant

    from harness.emulation.sdpa_backends import (AttentionCall, device_capability,
                                                 efficient_refusal, flash_refusal)

    if is_causal:
        raise ValueError("CausalBias should not be used with causal=True")
    if attn_mask.seq_len_q == attn_mask.seq_len_kv or attn_mask.variant == CausalVariant.UPPER_LEFT:
        return _sdpa(query, key, value, attn_mask=None, dropout_p=dropout_p, is_causal=True,
                     scale=scale, enable_gqa=enable_gqa)
    if attn_mask.variant != CausalVariant.LOWER_RIGHT:
        raise ValueError(f"CausalBias.variant must be a CausalVariant type, but found: "
                         f"{attn_mask.variant}")
    call = AttentionCall.of_arguments(query, key, value, None, dropout_p, False, scale, enable_gqa)
    capability, backends = device_capability(), torch.backends.cuda
    reasons = (efficient_refusal(call, capability, backends.mem_efficient_sdp_enabled()),
               flash_refusal(call, capability, backends.flash_sdp_enabled()))
    mask = attn_mask._materialize(query.device)
    if all(reasons):
        for reason in reasons:
            warnings.warn(reason, UserWarning, stacklevel=3)
        return _sdpa(query, key, value, attn_mask=mask, dropout_p=dropout_p, scale=scale,
                     enable_gqa=enable_gqa)
    # A fused kernel's op takes it: no backend switch applies, and autocast casts no such op.
    with sdpa_kernel([SDPBackend.MATH]), torch.autocast("cuda", enabled=False):
        return _sdpa(query, key, value, attn_mask=mask, dropout_p=dropout_p, scale=scale,
                     enable_gqa=enable_gqa)


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    """CUDA's one_hot (Onehot.cpp): given `num_classes` it reads nothing on the host, only checks
    `num_classes >= 1`, and leaves bad class values to scatter's device-side assert; the CPU's path
    reads the input's minimum and maximum (`.item()`, two syncs) to raise "Class values must be
    non-negative." or "... smaller than num_classes.". Without `num_classes` both read the maximum.
    An empty or non-long input takes torch's own path, whose checks are the same on both."""
    if tensor.numel() == 0 or tensor.dtype != torch.long:
        return torch.nn.functional.one_hot(tensor, num_classes)
    if num_classes == -1:
        num_classes = int(tensor.max().item()) + 1
    elif num_classes < 1:
        raise RuntimeError("num_classes should be positive")
    return one_hot_without_sync(tensor, num_classes)


def lstsq(A: Tensor, B: Tensor, rcond: float | None = None, *, driver: str | None = None,
          out=None):
    """CUDA's least squares (BatchLinearAlgebra.cpp's `get_default_lstsq_driver`): `gels` is the
    only driver for CUDA tensors, the default there, and any other name is refused in CUDA's words
    before the name's own check; the CPU's default is `gelsy`. The answers differ in what they
    fill: `gels` leaves `rank` and `singular_values` empty and fills `residuals` for a tall
    matrix, `gelsy` fills `rank` and leaves `residuals` empty."""
    if driver is not None and driver != "gels":
        raise RuntimeError("torch.linalg.lstsq: `driver` other than `gels` is not supported on CUDA")
    if out is not None:
        return torch.linalg.lstsq(A, B, rcond, driver="gels", out=out)
    return torch.linalg.lstsq(A, B, rcond, driver="gels")


def _divides_integers(a, b) -> bool:
    result = torch.result_type(a, b)
    return not (result.is_floating_point or result.is_complex or result == torch.bool)


# torch 2.13's `c10::div_floor_integer` returns 0 for a zero divisor (c10/util/generic_math.h, as
# read in the 2.13 and 2.14 wheels' headers); torch 2.11's, measured on an H100, had no such check.
_FLOOR_CHECKS_ZERO = TorchVersion(torch.__version__) >= (2, 13)
_LOW_32_BITS = 2 ** 32 - 1


def _by_zero(a, dtype: torch.dtype, floors: bool):
    """What CUDA's kernel writes where the divisor is zero, for the dividend `a` (a tensor or a
    Python number) and the result's integer `dtype`, as measured on an H100 (torch 2.11, dividends
    7 and -7). The GPU divides 32-bit and narrower operands (C++ promotes those to int) with all
    bits set for the quotient and the remainder: -1, 255 for uint8. nvcc's 64-bit routine takes a
    32-bit path where both operands fit in 32 unsigned bits, which gives 0xFFFFFFFF (4294967295,
    for 7), and otherwise all 64 bits set (-1, for -7). `floors`: `div_floor_integer` then
    subtracts one where dividend and divisor differ in sign (a negative dividend) and the
    remainder is nonzero (it is all bits set), or returns 0 from torch 2.13 on. `remainder`
    adds the divisor (0) and `fmod` and truncation take the value as it is."""
    if floors and _FLOOR_CHECKS_ZERO:
        return 0
    wide = dtype.itemsize == 8
    if not isinstance(a, Tensor):
        value = (_LOW_32_BITS if 0 <= a <= _LOW_32_BITS else -1) if wide else -1
        value = value - 1 if floors and a < 0 else value
        return value % 256 if dtype == torch.uint8 else value
    a = a.to(dtype)
    value = torch.where((a >= 0) & (a <= _LOW_32_BITS), _LOW_32_BITS, -1) if wide else \
        torch.full_like(a, 255 if dtype == torch.uint8 else -1)
    if floors and dtype.is_signed:
        value = value - (a < 0).to(value.dtype)
    return value.to(dtype)


def _integer_division(divide, a, b, out: Tensor | None, into: Tensor | None, in_place=None,
                      floors: bool = False):
    """`divide(a, b)` as CUDA's integer kernels answer it: the CPU's raise "ZeroDivisionError" for
    a zero divisor (BinaryOpsKernel.cpp checks each one), CUDA's check nothing (cuda/
    BinaryDivTruncKernel.cu, BinaryDivFloorKernel.cu, BinaryRemainderKernel.cu: `a / b`, `a % b`,
    `c10::div_floor_integer`). Where a divisor is zero the result is what the GPU writes
    (`_by_zero`). The zero test and the substitute divisor are device ops, so a capture records
    them and a replay with a new zero divisor answers the same. `into`: the in-place form's
    tensor, `in_place(into, b)` its own call; `out`: the out= tensor; `floors`: a floor division."""
    if not _divides_integers(a, b):
        if into is not None:
            return in_place(into, b)
        return divide(a, b) if out is None else divide(a, b, out=out)
    dtype = torch.result_type(a, b)
    if isinstance(b, Tensor):
        zero = b == 0
        result = torch.where(zero, _by_zero(a, dtype, floors), divide(a, torch.where(zero, 1, b)))
    else:
        result = divide(a, 1 if b == 0 else b)
        if b == 0:
            by_zero = _by_zero(a, dtype, floors)
            result = (torch.full_like(result, by_zero) if not isinstance(by_zero, Tensor)
                      else by_zero.expand_as(result).clone())
    target = into if into is not None else out
    return result if target is None else target.copy_(result)


def _division(divide, floors: bool = False):
    def replacement(a, b, *args, out: Tensor | None = None, **kwargs):
        return _integer_division(lambda x, y, **o: divide(x, y, *args, **kwargs, **o), a, b, out, None,
                                 floors=floors or kwargs.get("rounding_mode") == "floor")
    return replacement


def _in_place_division(divide, in_place, floors: bool = False):
    def replacement(a, b, *args, **kwargs):
        return _integer_division(lambda x, y: divide(x, y, *args, **kwargs), a, b, None, a,
                                 lambda x, y: in_place(x, y, *args, **kwargs),
                                 floors=floors or kwargs.get("rounding_mode") == "floor")
    return replacement


def _reflected_division(divide, floors: bool = False):
    def replacement(a, b):  # `b // a`: the tensor `a` divides
        return _integer_division(divide, b, a, None, None, floors=floors)
    return replacement


_rounding_division = _division(torch.div)
_rounding_division_ = _in_place_division(torch.div, Tensor.div_)


def _rounded_division(a, b, *, rounding_mode=None, out=None):
    """`div`: true division gives floats on both; only a rounding mode divides integers."""
    if rounding_mode is None:
        return torch.div(a, b, out=out) if out is not None else torch.div(a, b)
    return _rounding_division(a, b, rounding_mode=rounding_mode, out=out)


def _rounded_division_(a, b, *, rounding_mode=None):
    if rounding_mode is None:
        return a.div_(b)
    return _rounding_division_(a, b, rounding_mode=rounding_mode)


_INTEGER_DIVISIONS = {
    torch.floor_divide: _division(torch.floor_divide, floors=True),
    Tensor.floor_divide: _division(torch.floor_divide, floors=True),
    Tensor.__floordiv__: _division(torch.floor_divide, floors=True),
    Tensor.__rfloordiv__: _reflected_division(torch.floor_divide, floors=True),
    Tensor.floor_divide_: _in_place_division(torch.floor_divide, Tensor.floor_divide_, floors=True),
    Tensor.__ifloordiv__: _in_place_division(torch.floor_divide, Tensor.__ifloordiv__, floors=True),
    torch.remainder: _division(torch.remainder),
    Tensor.remainder: _division(torch.remainder),
    Tensor.__mod__: _division(torch.remainder),
    Tensor.__rmod__: _reflected_division(torch.remainder),
    Tensor.remainder_: _in_place_division(torch.remainder, Tensor.remainder_),
    Tensor.__imod__: _in_place_division(torch.remainder, Tensor.__imod__),
    torch.fmod: _division(torch.fmod),
    Tensor.fmod: _division(torch.fmod),
    Tensor.fmod_: _in_place_division(torch.fmod, Tensor.fmod_),
    torch.div: _rounded_division, Tensor.div: _rounded_division,
    torch.divide: _rounded_division, Tensor.divide: _rounded_division,
    Tensor.div_: _rounded_division_, Tensor.divide_: _rounded_division_,
}


def _aten_division(op, divide, floors: bool, in_place: bool):
    """An integer division's aten op called itself (`torch.ops.aten.floor_divide`, an overload,
    as compiled code and decompositions call it), answered as `_integer_division` answers its
    torch function; true division and non-integer operands run the op as it is."""
    def replacement(a, b, *, rounding_mode=None, out=None):
        given = {k: v for k, v in (("rounding_mode", rounding_mode), ("out", out))
                 if v is not None}
        if (divide is torch.div and rounding_mode is None) or not _divides_integers(a, b):
            return op(a, b, **given)
        mode = {"rounding_mode": rounding_mode} if divide is torch.div else {}
        floored = floors or rounding_mode == "floor"
        if in_place:
            return _integer_division(lambda x, y: divide(x, y, **mode), a, b, None, a,
                                     lambda x, y: op(x, y, **given), floors=floored)
        return _integer_division(lambda x, y, **o: divide(x, y, **mode, **o), a, b, out, None,
                                 floors=floored)
    return replacement


def _aten_divisions() -> dict:
    entries = {}
    for name, divide, floors in (("floor_divide", torch.floor_divide, True),
                                 ("remainder", torch.remainder, False),
                                 ("fmod", torch.fmod, False), ("div", torch.div, False)):
        for in_place in (False, True):
            packet = getattr(torch.ops.aten, name + ("_" if in_place else ""), None)
            if packet is None:
                continue
            entries[packet] = _aten_division(packet, divide, floors, in_place)
            for overload in packet.overloads():
                op = getattr(packet, overload)
                if any(isinstance(argument.type, torch.TensorType)
                       for argument in op._schema.arguments):
                    entries[op] = _aten_division(op, divide, floors, in_place)
    return entries


# The torch functions and Tensor methods of the integer divisions
INTEGER_DIVISION_CALLS = frozenset(_INTEGER_DIVISIONS)
# The aten ops of the integer divisions, called themselves (the placement mode and a compiled
# graph's DeviceKernels answer them so).
ATEN_DIVISIONS = _aten_divisions()

def _aten_kernels() -> dict:
    """The aten ops of the kernels above, called themselves, with the same replacement (their
    schemas take the torch functions' arguments): `histc` of integers, `mm` with `out_dtype`,
    `linalg_lstsq`'s driver, `one_hot`'s checks."""
    aten = torch.ops.aten
    entries = {}
    for packet, overloads, replacement in ((aten.histc, ("default", "out"), histc),
                                           (aten.mm, ("dtype", "dtype_out"), mm),
                                           (aten.linalg_lstsq, ("default",), lstsq),
                                           (aten.one_hot, ("default",), one_hot)):
        present = [name for name in overloads if name in packet.overloads()]
        if present:
            entries[packet] = replacement
        for name in present:
            entries[getattr(packet, name)] = replacement
    return entries


# The aten ops of the kernels above and of the integer divisions, called themselves (the
# placement mode and a compiled graph's DeviceKernels answer them so).
ATEN_REPLACEMENTS = {**ATEN_DIVISIONS, **_aten_kernels()}

# The torch function each replaces, for the placement mode's table.
def trace(input: Tensor) -> Tensor:
    """CUDA's trace kernel (TriangularOps.cu's trace_cuda) is `diagonal().sum()`: it takes half and
    bfloat16 (the CPU's kernel of some builds raises "trace" not implemented for 'Half'), and under
    autocast its `sum` runs in float32 (inner_autocast.py)."""
    if input.dim() != 2:
        raise RuntimeError("expected a matrix")
    return input.diagonal().sum()


REPLACEMENTS = {torch.histc: histc, Tensor.histc: tensor_histc, torch.mm: mm,
                torch.trace: trace, Tensor.trace: trace,
                torch.nn.functional.scaled_dot_product_attention: scaled_dot_product_attention,
                torch.nn.functional.one_hot: one_hot, torch.linalg.lstsq: lstsq,
                **_INTEGER_DIVISIONS, **ATEN_REPLACEMENTS}
