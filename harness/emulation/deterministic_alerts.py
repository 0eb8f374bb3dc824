"""`torch.use_deterministic_algorithms(True)` for the CUDA kernels that have no deterministic form.

Under the deterministic mode each such kernel calls `Context::alertNotDeterministic(caller)` before
it runs, which raises a `RuntimeError` ("<caller> does not have a deterministic implementation,
but you set 'torch.use_deterministic_algorithms(True)'. ...") or, with `warn_only=True`, warns. The
checks sit in the CUDA kernels, or behind `self.device().type() == DeviceType::CUDA` in shared code
(`put_`), so the emulated device, whose tensors are cpu tensors to ATen, ran the CPU's kernels and
never alerted: a runtime's deterministic mode (SGLang's and vLLM's batch-invariant inference, a
reproducible training run) passed on the CPU and raised on a GPU at its first `histc`, weighted
`bincount` or adaptive pooling's backward.

The callers and their conditions, as the CUDA kernels write them (SummaryOps.cu, Sorting.cu,
TensorAdvancedIndexing.cpp, ScatterGatherKernel.cu, LossNLL2d.cu, GridSampler.cu, LossCTC.cu,
EmbeddingBag.cu and the upsampling, pooling and padding kernels), each caller's text found in the
CUDA wheels of torch 2.11 and 2.14, and each measured on a GPU (NVIDIA H100, torch 2.11.0+cu130,
2026-12-07). The alerts the CPU's kernels make themselves (`put_` without accumulate,
`max_unpool`) stay the CPU's.

Not alerts on the builds the harness supports, though older releases and torch's documentation
list them (measured on the H100): a float `cumsum` and `multinomial` of several samples with
replacement (its CUDA kernel's running sum) run quietly, cumsum having become deterministic
(PyTorch #89492, closed); cuBLAS's gemms no longer ask for CUBLAS_WORKSPACE_CONFIG (PyTorch
#161749 removed `alertCuBLASConfigNotDeterministic`'s text, absent from the 2.11 and 2.14 wheels);
bilinear and trilinear interpolation, replicate padding and (from torch 2.13) 3-d max pooling take
a deterministic decomposition in their Python body on a CUDA input (device_branches.py), so only a
direct call of their backward kernels alerts.

While the mode is on, each device call runs under a dispatch mode that asks every aten op it
reaches; with the mode off nothing is entered."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from harness.emulation.device_memory import is_device_memory
from harness.graphs.emulator.opinfo import bind
from harness.graphs.emulator.tensor_subclasses import defer_to_subclass
from harness.torch_internals import TorchDispatchMode, tree_flatten

aten = torch.ops.aten

_RAISED = ("{caller} does not have a deterministic implementation, but you set "
           "'torch.use_deterministic_algorithms(True)'. You can turn off determinism just for this "
           "operation, or you can use the 'warn_only=True' option, if that's acceptable for your "
           "application. You can also file an issue at https://github.com/pytorch/pytorch/issues "
           "to help us prioritize adding deterministic support for this operation.")
_WARNED = ("{caller} does not have a deterministic implementation, but you set "
           "'torch.use_deterministic_algorithms(True, warn_only=True)'. You can file an issue at "
           "https://github.com/pytorch/pytorch/issues to help us prioritize adding deterministic "
           "support for this operation.")


@dataclass(frozen=True)
class Alert:
    """What CUDA says of a call without a deterministic form: raised, or warned under warn_only."""

    raised: str
    warned: str


def _kernel_alert(caller: str) -> Alert:
    return Alert(_RAISED.format(caller=caller), _WARNED.format(caller=caller))


def _always(caller: str) -> Callable[[dict], str | None]:
    return lambda named: caller


def _histc(named: dict) -> str | None:
    """Only floating input alerts: CUDA's integer histogram counts exactly (its atomics add
    integers)."""
    return "_histc_cuda with floating point input" if named["self"].is_floating_point() else None


def _bincount(named: dict) -> str | None:
    return "_bincount_cuda" if named.get("weights") is not None else None


def _put(named: dict) -> str | None:
    return "put_" if named.get("accumulate") else None  # without accumulate the CPU alerts too


def _scatter_reduce(named: dict) -> str | None:
    """Sums and means take index_put's deterministic path on CUDA; products alert."""
    return "scatter_reduce_cuda_prod_" if named["reduce"] == "prod" else None


def _nll_loss2d(named: dict) -> str | None:
    return "nll_loss2d_forward_out_cuda_template" if named["reduction"] != 0 else None


def _embedding_bag_backward(named: dict) -> str | None:
    return "embedding_bag_backward_cuda_max" if named["mode"] == 2 else None  # mode="max"


def _packets(names: dict[str, Callable[[dict], str | None]]) -> dict:
    return {getattr(aten, name): rule for name, rule in names.items() if hasattr(aten, name)}


_ALERTS: dict = _packets({
    "histc": _histc,
    "bincount": _bincount,
    "median": lambda named: "median CUDA with indices output" if "dim" in named else None,
    "nanmedian": lambda named: "median CUDA with indices output" if "dim" in named else None,
    "put_": _put, "put": _put,
    "scatter_reduce": _scatter_reduce, "scatter_reduce_": _scatter_reduce,
    "nll_loss2d_forward": _nll_loss2d,
    "upsample_linear1d_backward": _always("upsample_linear1d_backward_out_cuda"),
    "upsample_bilinear2d_backward": _always("upsample_bilinear2d_backward_out_cuda"),
    "upsample_bicubic2d_backward": _always("upsample_bicubic2d_backward_out_cuda"),
    "upsample_trilinear3d_backward": _always("upsample_trilinear3d_backward_out_cuda"),
    "_adaptive_avg_pool2d_backward": _always("adaptive_avg_pool2d_backward_cuda"),
    "_adaptive_avg_pool3d_backward": _always("adaptive_avg_pool3d_backward_cuda"),
    "adaptive_avg_pool3d_backward": _always("adaptive_avg_pool3d_backward_cuda"),
    "adaptive_max_pool2d_backward": _always("adaptive_max_pool2d_backward_cuda"),
    "avg_pool3d_backward": _always("avg_pool3d_backward_cuda"),
    "fractional_max_pool2d_backward": _always("fractional_max_pool2d_backward_cuda"),
    "fractional_max_pool3d_backward": _always("fractional_max_pool3d_backward_cuda"),
    "reflection_pad1d_backward": _always("reflection_pad1d_backward_out_cuda"),
    "reflection_pad2d_backward": _always("reflection_pad2d_backward_cuda"),
    "reflection_pad3d_backward": _always("reflection_pad3d_backward_out_cuda"),
    "grid_sampler_2d_backward": _always("grid_sampler_2d_backward_cuda"),
    "grid_sampler_3d_backward": _always("grid_sampler_3d_backward_cuda"),
    "_ctc_loss_backward": _always("ctc_loss_backward_gpu"),
    "_embedding_bag_backward": _embedding_bag_backward,
    "_embedding_bag_dense_backward": _embedding_bag_backward,
})


def cuda_alert(func, args: tuple, kwargs: dict) -> Alert | None:
    """What CUDA's kernel for this aten op says under the deterministic mode, on these arguments,
    or None where it runs deterministically (or is not CUDA's to alert)."""
    packet = getattr(func, "overloadpacket", None)
    rule = _ALERTS.get(packet)
    if rule is None:
        return None
    flat, _ = tree_flatten((args, kwargs))
    if not any(isinstance(a, torch.Tensor) and is_device_memory(a) for a in flat):
        return None
    caller = rule(bind(func, args, kwargs))
    return None if caller is None else _kernel_alert(caller)


def alert(found: Alert) -> None:
    """CUDA's alert: a warning under warn_only, else the error."""
    if torch.is_deterministic_algorithms_warn_only_enabled():
        warnings.warn(found.warned, UserWarning, stacklevel=3)
        return
    raise RuntimeError(found.raised)


class _AlertNondeterministic(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if types and defer_to_subclass(types):
            return NotImplemented  # the subclass's own dispatch first (tensor_subclasses.py)
        kwargs = kwargs or {}
        found = cuda_alert(func, args, kwargs)
        if found is not None:
            alert(found)
        return func(*args, **kwargs)


def call_alerting(call, func, args: tuple, kwargs: dict):
    """`call(func, args, kwargs)` with CUDA's deterministic alerts for the aten ops it reaches."""
    with _AlertNondeterministic():
        return call(func, args, kwargs)


__all__ = ["Alert", "alert", "call_alerting", "cuda_alert"]
