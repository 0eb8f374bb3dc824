"""CUDA's autocast for the aten ops a composite runs inside, on the emulated device.

On CUDA autocast is a dispatch key: every aten op meets it, also the ops a composite runs inside
(a CompositeImplicitAutograd kernel such as `trapezoid`, `sum_to_size`, `cov`, `inner`, a
composite-explicit one such as `ldexp`, a CUDA kernel written as other ops such as `trace_cuda`'s
`diagonal().sum()`), unless an autocast kernel of the outer op already ran (its redispatch excludes
autocast). The placement mode casts at the torch-function level and meets only the outer call, so
`torch.trapezoid(bf16)` stayed bfloat16 where CUDA's inner `sum` gives float32.

The emulated device's tensors are CPU tensors, so their ops pass the AutocastCPU dispatch key,
which fires while CPU autocast is enabled. For the duration of the emulation this module registers,
on that key, CUDA's policies for CUDA's lists (autocast_mode.h's AT_FORALL_* macros, by aten
overload, each kept where this torch registers a CUDA autocast kernel for it: the lists change
between releases, and a CPU build registers them too) and a fallthrough for every other op the CPU's own autocast lists; the placement enables
CPU autocast only around a device call that no autocast list of CUDA's names, while CUDA's
autocast is on (`casting_inner_ops`). The casts are aten ops above autograd, as CUDA's are, so
gradients flow through them. Eligible, as on CUDA, are floating tensors other than float64 of the
device: inside a device call every tensor with a dimension (its intermediates are device memory on
CUDA; a host tensor of one or more dimensions cannot join a device op). A CPU autocast region a
user opens inside the emulation casts nothing: device tensors are left alone, as CUDA's autocast
leaves them, and so are host tensors (there CPU autocast's own lists are not in force).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Callable, Iterator

import torch

from harness import torch_internals
from harness.emulation.autocast import BCE_BANNED, promote_type

_REDUCED = (torch.float16, torch.bfloat16)
_LOWER_PRECISION = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu",
    "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm",
    "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention")
_FLOAT32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar",
    "softplus", "layer_norm", "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm.dim",
    "nuclear_norm", "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss",
    "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss",
    "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
    "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
    "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa", "upsample_trilinear3d",
    "upsample_bicubic2d", "_upsample_bicubic2d_aa")
_FLOAT32_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
    "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
    "sum.dim_IntList", "prod.dim_Dimname", "softmax.Dimname", "log_softmax.Dimname",
    "cumprod.dimname", "cumsum.dimname", "sum.dim_DimnameList")
# fp32_append_dtype: the overload without a dtype redispatched to the one with it, which takes
# every argument (the defaults of the one without: p=2, keepdim=False)
_FLOAT32_APPEND_DTYPE = {
    "norm.Scalar": ("ScalarOpt_dtype", (None, 2)),
    "norm.ScalarOpt_dim": ("ScalarOpt_dim_dtype", (None, None, None, False)),
    "norm.names_ScalarOpt_dim": ("names_ScalarOpt_dim_dtype", (None, None, None, False))}
_PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
            "index_put", "tensordot", "scatter_add")
_BANNED = ("binary_cross_entropy",)


def _overload(name: str):
    """The aten overload `name` ("mm", "pow.Scalar") names, or None where this torch lacks it."""
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    return None if packet is None else getattr(packet, overload or "default", None)


class InnerAutocast:
    """CUDA's autocast policies on the AutocastCPU key, for one emulated device's lifetime."""

    def __init__(self, is_device: Callable[[torch.Tensor], bool],
                 call_on_device: Callable[[], bool]) -> None:
        self._is_device = is_device
        self._call_on_device = call_on_device
        self._library = None

    def register(self) -> None:
        library = torch.library.Library("aten", "IMPL")
        policies = {**dict.fromkeys(_LOWER_PRECISION, self._lower), **dict.fromkeys(
            _FLOAT32, self._float32), **dict.fromkeys(_FLOAT32_SET_OPT_DTYPE, self._set_opt_dtype),
            **dict.fromkeys(_FLOAT32_APPEND_DTYPE, self._append_dtype),
            **dict.fromkeys(_PROMOTE, self._promote), **dict.fromkeys(_BANNED, self._banned)}
        cast, passed = _this_torchs_lists()
        with warnings.catch_warnings():
            # torch warns once that a kernel of the CPU's autocast is overridden
            warnings.simplefilter("ignore", UserWarning)
            for name in cast:
                op = _overload(name)
                kernel = policies[name](name if name in _FLOAT32_APPEND_DTYPE else op)
                library.impl(name, _only_under_cuda_autocast(kernel, op), "AutocastCPU")
            for name in passed:
                library.impl(name, torch.library.fallthrough_kernel, "AutocastCPU")
        self._library = library

    def unregister(self) -> None:
        if self._library is not None:
            self._library._destroy()
            self._library = None

    # --- the policies (autocast_mode.h's WrapFunction_) ------------------------------------------

    def _eligible(self, t) -> bool:
        return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64 \
            and (self._is_device(t) or (t.dim() > 0 and self._call_on_device()))

    def _casting(self, op, dtype_of: Callable[[tuple, dict], torch.dtype]):
        eligible = self._eligible

        def kernel(*args, **kwargs):
            with _autocast_excluded():
                dtype = dtype_of(args, kwargs)

                def cast(a):
                    if eligible(a) and a.dtype != dtype:
                        return a.to(dtype)
                    if type(a) in (list, tuple):
                        return type(a)(cast(b) for b in a)
                    return a

                return op(*(cast(a) for a in args), **{k: cast(v) for k, v in kwargs.items()})

        return kernel

    def _lower(self, op):
        return self._casting(op, lambda args, kwargs: torch.get_autocast_dtype("cuda"))

    def _float32(self, op):
        return self._casting(op, lambda args, kwargs: torch.float32)

    def _promote(self, op):
        eligible = self._eligible

        def dtype_of(args, kwargs):
            found = [t.dtype for a in (*args, *kwargs.values())
                     for t in (a if type(a) in (list, tuple) else (a,)) if eligible(t)]
            return promote_type(found, torch.get_autocast_dtype("cuda"))

        return self._casting(op, dtype_of)

    def _set_opt_dtype(self, op):
        eligible = self._eligible
        at = next(i for i, a in enumerate(op._schema.arguments) if a.name == "dtype")

        def kernel(*args, **kwargs):
            with _autocast_excluded():
                if args and eligible(args[0]):
                    if len(args) > at:
                        if args[at] is None:
                            args = (*args[:at], torch.float32, *args[at + 1:])
                    elif kwargs.get("dtype") is None:
                        kwargs = {**kwargs, "dtype": torch.float32}
                return op(*args, **kwargs)

        return kernel

    def _append_dtype(self, name: str):
        eligible = self._eligible
        overload, defaults = _FLOAT32_APPEND_DTYPE[name]
        with_dtype = getattr(torch.ops.aten.norm, overload)

        def kernel(*args):
            with _autocast_excluded():
                dtype = torch.float32 if eligible(args[0]) else args[0].dtype
                return with_dtype(*args, *defaults[len(args):], dtype=dtype)

        return kernel

    def _banned(self, op):
        eligible = self._eligible

        def kernel(*args, **kwargs):
            if any(eligible(a) for a in args):
                raise RuntimeError(BCE_BANNED)
            with _autocast_excluded():
                return op(*args, **kwargs)

        return kernel


@functools.cache
def _this_torchs_lists() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The ops of CUDA's lists this torch registers a CUDA autocast kernel for (an op it does not
    register keeps CUDA's own kernel's dtype: rms_norm joined the float32 list after 2.11), and
    every other aten op the CPU's autocast lists: properties of the build, read once per process
    (the scan of every op's kernels costs more than the registering)."""
    listed = (*_LOWER_PRECISION, *_FLOAT32, *_FLOAT32_SET_OPT_DTYPE, *_FLOAT32_APPEND_DTYPE,
              *_PROMOTE, *_BANNED)
    cast = tuple(name for name in listed if _overload(name) is not None
                 and torch_internals.dispatch_has_kernel_for_dispatch_key(f"aten::{name}",
                                                                          "AutocastCUDA"))
    passed = tuple(
        name.removeprefix("aten::") for name in torch_internals.dispatch_get_all_op_names()
        if name.startswith("aten::") and name.removeprefix("aten::") not in listed
        and torch_internals.dispatch_has_kernel_for_dispatch_key(name, "AutocastCPU"))
    return cast, passed


def _only_under_cuda_autocast(kernel: Callable, op) -> Callable:
    """`kernel` while CUDA's autocast is on; else `op` as it is: CUDA's autocast leaves device
    tensors alone in a CPU autocast region a user opens."""

    def guarded(*args, **kwargs):
        if torch.is_autocast_enabled("cuda"):
            return kernel(*args, **kwargs)
        with _autocast_excluded():
            return op(*args, **kwargs)

    return guarded


@contextlib.contextmanager
def _autocast_excluded() -> Iterator[None]:
    keys = torch_internals.DispatchKeySet(torch_internals.DISPATCH_KEY_AUTOCAST_CPU)
    with torch_internals.ExcludeDispatchKeyGuard(keys):
        yield


@contextlib.contextmanager
def casting_inner_ops() -> Iterator[None]:
    """CPU autocast on for one device call, so the ops inside it meet CUDA's policies."""
    if torch.is_autocast_enabled("cpu"):
        yield
        return
    torch.set_autocast_enabled("cpu", True)
    try:
        yield
    finally:
        torch.set_autocast_enabled("cpu", False)


__all__ = ["InnerAutocast", "casting_inner_ops"]
