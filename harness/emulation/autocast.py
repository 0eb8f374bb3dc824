"""`torch.autocast("cuda")` on the emulated CUDA device.

Device tensors are cpu tensors, so CUDA's autocast dispatch key never fires for them; the placement
mode asks `cast(...)` instead, for each torch call made while autocast is enabled on "cuda". The
lists are CUDA's (aten/src/ATen/autocast_mode.cpp, by their torch-level names): ops that run in the
autocast dtype, ops that run in float32, ops that run in float32 unless given a dtype, and ops that
run in the widest dtype of their inputs (refusing, as CUDA does, a reduced dtype other than the
autocast dtype among them); and the RNNs, which cuDNN runs in float16 whatever the
autocast dtype (`_cudnn_rnn`'s own autocast kernel, aten/src/ATen/cudnn/AutocastRNN.cpp). As on
CUDA only device tensors are cast, float64 never to the lower precision, and a float32 leaf that requires grad (a weight) is cast once per outermost
autocast region while `cache_enabled`: the cached copy is what later calls read, until the region
exits (`torch.clear_autocast_cache()`).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch

from harness import torch_internals
import torch.nn.functional as F

Tensor = torch.Tensor
_nn = torch_internals.nn_module

_LOWER_PRECISION = frozenset({
    torch.matmul, Tensor.matmul, Tensor.__matmul__, Tensor.__rmatmul__, torch.mm, Tensor.mm,
    torch.bmm, Tensor.bmm, torch.mv, Tensor.mv, torch.addmm, Tensor.addmm, torch.addmv,
    Tensor.addmv, torch.addr, Tensor.addr, torch.baddbmm, Tensor.baddbmm, torch.addbmm,
    Tensor.addbmm, torch.einsum, torch.chain_matmul, torch.linalg.multi_dot, torch.linalg.vecdot,
    _nn.linear, F.linear, torch.conv1d, torch.conv2d, torch.conv3d, torch.conv_tbc,
    torch.conv_transpose1d, torch.conv_transpose2d, torch.conv_transpose3d, torch.convolution,
    torch.prelu, F.prelu, torch.lstm_cell, torch.gru_cell, torch.rnn_tanh_cell, torch.rnn_relu_cell,
    _nn.scaled_dot_product_attention, F.scaled_dot_product_attention,
    # not listed on CUDA, but its kernel's bmm is, and runs under autocast (F.affine_grid)
    torch.affine_grid_generator,
})
_FLOAT32 = frozenset({
    torch.acos, Tensor.acos, torch.asin, Tensor.asin, torch.cosh, Tensor.cosh, torch.erfinv,
    Tensor.erfinv, torch.exp, Tensor.exp, torch.expm1, Tensor.expm1, torch.log, Tensor.log,
    torch.log10, Tensor.log10, torch.log2, Tensor.log2, torch.log1p, Tensor.log1p,
    torch.reciprocal, Tensor.reciprocal, torch.rsqrt, Tensor.rsqrt, torch.sinh, Tensor.sinh,
    torch.tan, Tensor.tan, torch.pow, Tensor.pow, Tensor.__pow__, Tensor.__rpow__, F.softplus,
    _nn.softplus, torch.layer_norm, F.layer_norm, torch.native_layer_norm, torch.group_norm,
    F.group_norm, torch.frobenius_norm, torch.nuclear_norm, torch.cosine_similarity,
    F.cosine_similarity, torch.poisson_nll_loss, F.poisson_nll_loss, torch.cosine_embedding_loss,
    F.cosine_embedding_loss, F.nll_loss, torch.hinge_embedding_loss, F.hinge_embedding_loss,
    torch.kl_div, F.kl_div, F.l1_loss, F.smooth_l1_loss, F.huber_loss, F.mse_loss,
    torch.margin_ranking_loss, F.margin_ranking_loss, F.multilabel_margin_loss,
    F.soft_margin_loss, torch.triplet_margin_loss, F.triplet_margin_loss, F.multi_margin_loss,
    F.binary_cross_entropy_with_logits, torch.binary_cross_entropy_with_logits, torch.dist,
    Tensor.dist, torch.pdist, torch.cdist, torch.renorm, Tensor.renorm, torch.logsumexp,
    Tensor.logsumexp, F.cross_entropy, _nn.nll_loss2d,
    # F.interpolate's kernels
    *(getattr(_nn, name) for name in (
        "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
        "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
        "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
        "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa")),
    # CompositeImplicitAutograd on CUDA: what they run inside (pow, log1p, expm1, logsumexp, a
    # norm) is on the list, so their result is float32; the emulated device meets only the outer
    # call. F.normalize divides the input by a float32 norm: the same as dividing a float32 input.
    torch.square, Tensor.square, F.normalize, torch.special.log1p, torch.special.expm1,
    torch.special.logsumexp, torch.pairwise_distance,
})
# Float32 unless the call names a dtype.
_FLOAT32_UNLESS_DTYPE = frozenset({
    torch.prod, Tensor.prod, torch.softmax, Tensor.softmax, F.softmax, torch.log_softmax,
    Tensor.log_softmax, F.log_softmax, torch.cumprod, Tensor.cumprod, torch.cumsum, Tensor.cumsum,
    torch.linalg.vector_norm, torch.linalg.matrix_norm, torch.sum, Tensor.sum,
    # composites, as above: torch.norm and linalg.norm reach linalg_vector_norm, matrix_norm or
    # nuclear_norm; softmin and torch.special's softmaxes reach softmax or log_softmax
    torch.norm, Tensor.norm, torch.linalg.norm, F.softmin, torch.special.softmax,
    torch.special.log_softmax,
})
# Refused under CUDA's autocast (autocast_mode.cpp's binary_cross_entropy_banned)
_BANNED = frozenset({F.binary_cross_entropy, _nn.binary_cross_entropy})
BCE_BANNED = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast.")
# CUDA's promote list (AT_FORALL_PROMOTE). cat and stack left it: they promote as without autocast.
_WIDEST = frozenset({
    torch.addcdiv, Tensor.addcdiv, torch.addcmul, Tensor.addcmul, torch.atan2, Tensor.atan2,
    torch.bilinear, F.bilinear, torch.cross, Tensor.cross, torch.dot, Tensor.dot, torch.vdot,
    Tensor.vdot, torch.grid_sampler, F.grid_sample, torch.index_put, Tensor.index_put,
    torch.scatter_add, Tensor.scatter_add, torch.tensordot,
})
PROMOTE_REFUSED = "Unexpected floating ScalarType in at::autocast::prioritize"
# The RNNs (torch._VF's, what nn.LSTM, nn.GRU and nn.RNN call): not on CUDA's lists themselves,
# autocast meets what they run, `_cudnn_rnn` or `linear` and the fused cells (see _rnn_cast).
_RNN = frozenset(getattr(torch_internals.packed_rnn_calls, name)
                       for name in ("lstm", "gru", "rnn_tanh", "rnn_relu"))
AUTOCAST_OPS = _LOWER_PRECISION | _FLOAT32 | _FLOAT32_UNLESS_DTYPE | _WIDEST | _RNN | _BANNED
_REDUCED = (torch.float16, torch.bfloat16)


class WeightCastCache:
    """CUDA autocast's cache of weight casts: one per emulated device set, emptied when the
    outermost autocast region exits."""

    def __init__(self) -> None:
        self._casts: dict[int, tuple[weakref.ref, Tensor]] = {}

    def get(self, t: Tensor, dtype: torch.dtype, cast: Callable[[Tensor], Tensor]) -> Tensor:
        entry = self._casts.get(id(t))
        if entry is not None and entry[0]() is t and entry[1].dtype == dtype:
            return entry[1]
        out = cast(t)
        self._casts[id(t)] = (weakref.ref(t), out)
        return out

    def clear(self) -> None:
        self._casts.clear()


def clearing_cache_too(cache: WeightCastCache, original):
    """A replacement for `torch.clear_autocast_cache` (what `torch.autocast.__exit__` calls as the
    outermost region exits): the emulated device's weight casts go with torch's own."""

    def clear_autocast_cache() -> None:
        cache.clear()
        original()

    return clear_autocast_cache


def cast(func, args: tuple, kwargs: dict, is_device: Callable[[Any], bool],
         to: Callable[[Tensor, torch.dtype], Tensor], cache: WeightCastCache) -> tuple[tuple, dict]:
    """`args`, `kwargs` with their device tensors cast as CUDA's autocast casts them for `func`."""
    if func in _RNN:
        return _rnn_cast(args, kwargs, is_device, to, cache)
    if func in _BANNED:
        _refuse_binary_cross_entropy(args, kwargs, is_device)
        return args, kwargs
    if func in _LOWER_PRECISION:
        dtype = torch.get_autocast_dtype("cuda")
        caching = torch.is_autocast_cache_enabled()

        def lower(t):
            if not (t.is_floating_point() and t.dtype not in (dtype, torch.float64) and is_device(t)):
                return t
            if caching and t.dtype == torch.float32 and t.requires_grad and t.is_leaf \
                    and t._base is None:
                return cache.get(t, dtype, lambda w: to(w, dtype))
            return to(t, dtype)
        return _map(lower, args, kwargs)
    if func in _FLOAT32 or (func in _FLOAT32_UNLESS_DTYPE and kwargs.get("dtype") is None):
        def widen(t):
            if t.dtype in _REDUCED and is_device(t):
                return to(t, torch.float32)
            return t
        return _map(widen, args, kwargs)
    if func in _WIDEST:
        widest = promote_type(
            (t.dtype for t in tensors(args, kwargs) if t.is_floating_point() and is_device(t)),
            torch.get_autocast_dtype("cuda"))

        def promote(t):
            if t.is_floating_point() and t.dtype not in (widest, torch.float64) and is_device(t):
                return to(t, widest)
            return t
        return _map(promote, args, kwargs)
    return args, kwargs


def promote_type(dtypes, autocast_dtype: torch.dtype) -> torch.dtype:
    """The dtype CUDA's promote policy runs in (autocast_mode.h's `prioritize`, over the device
    floating-point inputs in argument order): it starts from the autocast dtype, ignores float64,
    takes float32 once one is met, and refuses the other reduced dtype met before any float32
    (a bfloat16 input under float16 autocast)."""
    current = autocast_dtype
    for dtype in dtypes:
        if dtype == torch.float64:
            continue
        if current == torch.float32 or dtype == torch.float32:
            current = torch.float32
        elif dtype != autocast_dtype:
            raise RuntimeError(PROMOTE_REFUSED)
    return current


def _refuse_binary_cross_entropy(args: tuple, kwargs: dict,
                                 is_device: Callable[[Any], bool]) -> None:
    """CUDA's autocast refuses aten::binary_cross_entropy of device tensors. F.binary_cross_entropy
    checks the target's size in Python before it gets there: a mismatch keeps torch's ValueError."""
    given = list(tensors(args, kwargs))
    if not any(is_device(t) for t in given):
        return
    if len(given) >= 2 and given[0].size() != given[1].size():
        return
    raise RuntimeError(BCE_BANNED)


def _rnn_cast(args: tuple, kwargs: dict, is_device: Callable[[Any], bool],
              to: Callable[[Tensor, torch.dtype], Tensor],
              cache: WeightCastCache) -> tuple[tuple, dict]:
    """An RNN's arguments as CUDA's autocast casts them. Where CUDA takes the cuDNN path (RNN.cpp's
    use_cudnn: cuDNN not switched off by the user, the input, or a packed sequence's data, a
    non-empty device tensor of float64, float32 or float16, or of bfloat16 on compute capability
    8.0 and later: CUDAHooks::supportsBFloat16RNNWithCuDNN) `_cudnn_rnn`'s autocast kernel casts
    the input and hidden states (autocast's cached cast, cached only where float16 is the autocast
    dtype) and the weights (one uncached copy per call, copy_weights_to_flat_buf_views) to
    float16. Elsewhere CUDA's own RNN runs its cells through `linear` and the fused cell kernels,
    each cast to the autocast dtype, so the result is in that dtype: the arguments are cast to it
    as `linear` casts them, weights through the cache. Float64 is never cast."""
    data = args[0] if args else None
    if not (isinstance(data, Tensor) and is_device(data)):
        return args, kwargs
    cudnn_path = torch.backends.cudnn.enabled and data.numel() > 0 and (
        data.dtype in (torch.float64, torch.float32, torch.float16)
        or data.dtype == torch.bfloat16 and torch.cuda.get_device_capability()[0] > 7)
    dtype = torch.float16 if cudnn_path else torch.get_autocast_dtype("cuda")
    caching = torch.is_autocast_cache_enabled() and torch.get_autocast_dtype("cuda") == dtype

    def eligible(t: Tensor) -> bool:
        return t.is_floating_point() and t.dtype not in (dtype, torch.float64) and is_device(t)

    def cached_cast(t: Tensor) -> Tensor:
        if not eligible(t):
            return t
        if caching and t.dtype == torch.float32 and t.requires_grad and t.is_leaf \
                and t._base is None:
            return cache.get(t, dtype, lambda w: to(w, dtype))
        return to(t, dtype)

    # the weights are the last list of tensors (an LSTM's hidden states, a pair, come before)
    at = next((i for i in reversed(range(len(args))) if type(args[i]) in (list, tuple)), None)
    if at is None or not cudnn_path:
        return _map(cached_cast, args, kwargs)
    weights = args[at]
    if weights and eligible(weights[0]):
        weights = type(weights)(to(w, dtype) if isinstance(w, Tensor) else w for w in weights)
    before, kwargs = _map(cached_cast, args[:at], kwargs)
    after, _ = _map(cached_cast, args[at + 1:], {})
    return (*before, weights, *after), kwargs


def tensors(args, kwargs):
    for a in (*args, *kwargs.values()):
        if isinstance(a, Tensor):
            yield a
        elif type(a) in (list, tuple):
            yield from (b for b in a if isinstance(b, Tensor))


def _map(fn, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    def one(a):
        if isinstance(a, Tensor):
            return fn(a)
        if type(a) in (list, tuple):
            return type(a)(fn(b) if isinstance(b, Tensor) else b for b in a)
        return a
    return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}
