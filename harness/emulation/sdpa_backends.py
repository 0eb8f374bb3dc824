"""Which of CUDA's fused attention kernels takes an SDPA call: the filters of PyTorch's CUDA
`sdp_utils.cpp` for flash attention and memory-efficient attention, in CUDA's order and words,
as the emulated device's compute capability meets them.

The CPU build answers these questions for its own kernels, or not at all: its
`torch.backends.cuda.can_use_flash_attention` says False for every input (no CUDA flash kernel
was compiled), and its flash kernel refuses dropout, which CUDA's takes. So a runtime that asks
which kernel a call gets, or allows one kernel only (`sdpa_kernel(SDPBackend.FLASH_ATTENTION)`),
took another path on the emulated device than on a GPU.

cuDNN's attention is left out: its filters depend on the cuDNN release a wheel ships (head
dimensions, layouts, dropout ranges) and on whether the wheel prefers it, which a CPU build cannot
tell; a call that allows cuDNN attention is never refused here, and asking
`can_use_cudnn_attention` is refused by name (the CPU wheel said False for every input, the CUDA
wheel without a GPU failed in the driver).

The fused kernels' own aten ops (`aten::_scaled_dot_product_flash_attention` and kin), which code
may call after a query says yes, are refused by name for device tensors (`FUSED_OPS`): a CPU build
has no such kernel.
"""

from __future__ import annotations

import datetime
import sys
from dataclasses import dataclass

import torch

from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice
from harness.emulation.device_memory import is_device_memory

Tensor = torch.Tensor

# ScalarType's names (the allowed dtypes) and caffe2's TypeMeta names (a tensor's dtype).
_DTYPE_NAMES = {torch.float16: "Half", torch.bfloat16: "BFloat16", torch.float32: "Float",
                torch.float64: "Double"}
_TYPE_META_NAMES = {torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16",
                    torch.float32: "float", torch.float64: "double"}


@dataclass(frozen=True)
class AttentionCall:
    """The arguments sdp_utils.cpp's filters read (its `sdp_params`)."""

    query: Tensor
    key: Tensor
    value: Tensor
    attn_mask: Tensor | None
    dropout: float
    is_causal: bool
    enable_gqa: bool

    @classmethod
    def of_params(cls, params) -> "AttentionCall":
        """From `torch.backends.cuda.SDPAParams`."""
        return cls(params.query, params.key, params.value, params.attn_mask, params.dropout,
                   params.is_causal, params.enable_gqa)

    @classmethod
    def of_arguments(cls, query: Tensor, key: Tensor, value: Tensor, attn_mask=None,
                     dropout_p: float = 0.0, is_causal: bool = False, scale=None,
                     enable_gqa: bool = False) -> "AttentionCall":
        """From `F.scaled_dot_product_attention`'s arguments."""
        return cls(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)

    def requires_grad(self) -> bool:
        return torch.is_grad_enabled() and any(
            t.requires_grad for t in (self.query, self.key, self.value))


def _sizes(t: Tensor) -> str:
    return "[" + ", ".join(str(n) for n in t.shape) + "]"


def _dtype(t: Tensor) -> str:
    return _TYPE_META_NAMES.get(t.dtype, str(t.dtype).removeprefix("torch."))


def _on_device(call: AttentionCall) -> str:
    if is_device_memory(call.query):
        return ""
    where = [("cuda:0" if is_device_memory(t) else str(t.device))
             for t in (call.query, call.key, call.value)]
    return (f"All tensors need to be on cuda device. Got query on device: {where[0]}, key on "
            f"device: {where[1]}, value on device: {where[2]}")


def _four_dimensional(call: AttentionCall) -> str:
    dims = [t.dim() for t in (call.query, call.key, call.value)]
    if dims == [4, 4, 4]:
        return ""
    return (f"All fused kernels requires query, key and value to be 4 dimensional, but got Query "
            f"dim: {dims[0]}, Key dim: {dims[1]}, Value dim: {dims[2]} instead.")


def _batch_and_heads(call: AttentionCall) -> str:
    q, k, v = call.query, call.key, call.value
    sizes = f"Query.sizes(): {_sizes(q)}, Key sizes(): {_sizes(k)}, Value sizes(): {_sizes(v)}"
    if not q.size(0) == k.size(0) == v.size(0):
        return ("For dense inputs, both fused kernels require query, key and value to have the "
                f"same batch_size. {sizes} instead. To broadcast dense inputs, try using unsqueeze "
                "and expand_to before passing them into the kernel.")
    if call.enable_gqa:
        if k.size(-3) != v.size(-3):
            return ("Both fused kernels require key and value to have the same num_heads and "
                    f"batch_size but got: Key sizes: {_sizes(k)}, Value sizes: {_sizes(v)}, Query "
                    f"sizes: {_sizes(q)} instead.")
        if q.size(-3) % k.size(-3):
            return ("FlashAttentionV2 only supports grouped query attention, where the number of "
                    "heads in key/value must divide number of heads in query.Got input Key "
                    f"sizes(): {k.size(-3)}, Value sizes(): {v.size(-3)}, Query sizes(): "
                    f"{q.size(-3)} instead.")
        return ""
    if not q.size(-3) == k.size(-3) == v.size(-3):
        return ("For dense input, both fused kernels require query, key and value to have the "
                f"same num_heads. {sizes} instead. To broadcast dense inputs, try using unsqueeze "
                "and expand_to before passing them into the kernel.")
    return ""


def _nonzero_sequences(call: AttentionCall) -> str:
    if call.query.size(-2) and call.key.size(-2):
        return ""
    return "All fused kernels do not support zero seq_len_q or seq_len_kv."


def _last_stride_one(call: AttentionCall, ignore_singleton: bool) -> str:
    q, k, v, mask = call.query, call.key, call.value, call.attn_mask
    ones = all(t.stride(-1) == 1 for t in (q, k, v)) or (ignore_singleton and q.size(-1) == 1)
    mask_one = mask is None or mask.stride(-1) == 1
    if ones and mask_one:
        return ""
    tail = f", Attn_mask.stride(-1): {mask.stride(-1)}" if mask is not None else ""
    return ("All fused kernels require the last dimension of the input to have stride 1. Got "
            f"Query.stride(-1): {q.stride(-1)}, Key.stride(-1): {k.stride(-1)}, "
            f"Value.stride(-1): {v.stride(-1)}{tail} instead.")


def _dtypes(call: AttentionCall, allowed: tuple[torch.dtype, ...]) -> str:
    q, k, v = call.query, call.key, call.value
    if q.dtype == k.dtype == v.dtype and q.dtype in allowed:
        return ""
    names = ", ".join(_DTYPE_NAMES[d] for d in allowed)
    return (f"Expected query, key and value to all be of dtype: {{{names}}}. Got Query dtype: "
            f"{_dtype(q)}, Key dtype: {_dtype(k)}, and Value dtype: {_dtype(v)} instead.")


def _sm(capability: tuple[int, int]) -> str:
    return f"{capability[0]}.{capability[1]}"


def flash_refusal(call: AttentionCall, capability: tuple[int, int],
                  enabled: bool = True) -> str:
    """CUDA's reason for not running flash attention on the call (its first failing filter, in
    `can_use_flash_attention`'s order), or "" where the kernel takes it."""
    if not enabled:
        return "Flash attention has been runtime disabled."
    for check in (_on_device, _four_dimensional):
        if reason := check(call):
            return reason
    q, k, v = call.query, call.key, call.value
    if call.attn_mask is not None:
        return "Flash Attention does not support non-null attn_mask."
    if not (q.size(-1) == k.size(-1) == v.size(-1) and q.size(-1) <= 256):
        return ("Flash attention requires q,k,v to have the same last dimension and to be less "
                f"than or equal to 256. Got Query.size(-1): {q.size(-1)}, Key.size(-1): "
                f"{k.size(-1)}, Value.size(-1): {v.size(-1)} instead.")
    if not (8, 0) <= capability <= (12, 1):
        return ("Flash attention only supports gpu architectures in the range [sm80, sm121]. "
                f"Attempting to run on a sm {_sm(capability)} gpu.")
    if call.requires_grad() and ((8, 6) <= capability <= (8, 9) or (12, 0) <= capability):
        head = q.size(-1)
        if not (head <= 192 or (call.dropout <= 0.0 and head > 224)):
            return ("Flash attention currently doesn't support training with head_dim ∈ (192, "
                    "224] or (head_dim ∈ (224, 256] and dropout > 0.0) on gpu architectures in "
                    f"the range[sm86, sm89].Attempting to run with dropout set to: {call.dropout}"
                    f"and head_dim: {head} on a sm {_sm(capability)} gpu.")
    if call.is_causal and q.size(-2) != k.size(-2):
        return ("Flash attention does not support the is_causal flag when seqlen_q != seqlen_k. "
                f"Got seqlen_q: {q.size(-2)} seqlen_k: {k.size(-2)}. If you would like to use "
                "causal attention with non-square masks, please see CausalAttnMask.")
    low_precision = (torch.float16, torch.bfloat16) if capability[0] >= 8 else (torch.float16,)
    if reason := _dtypes(call, low_precision):
        return reason
    return (_batch_and_heads(call) or _nonzero_sequences(call)
            or _last_stride_one(call, ignore_singleton=True))


def _gemm_alignment(call: AttentionCall, capability: tuple[int, int]) -> int:
    """sdp_utils.cpp's `minimum_gemm_alignment`: elements a head dimension must be a multiple of."""
    half = call.query.dtype in (torch.float16, torch.bfloat16)
    alignment = 4 if capability[0] >= 8 else 1
    if capability[0] >= 8 or (capability[0] >= 7 and half):
        alignment = max(alignment, 128 // (16 if half else 32))
    return alignment


def efficient_refusal(call: AttentionCall, capability: tuple[int, int],
                      enabled: bool = True) -> str:
    """CUDA's reason for not running memory-efficient attention on the call, or ""."""
    if not enabled:
        return "Memory Efficient attention has been runtime disabled."
    if reason := _on_device(call):
        return reason
    if not (5, 0) <= capability <= (12, 1):
        return ("Mem Efficient Attention only supports gpu architectures in the range [sm50, "
                f"sm121]. Attempting to run on a sm {_sm(capability)} gpu.")
    if reason := _four_dimensional(call):
        return reason
    q, k, v = call.query, call.key, call.value
    alignment = _gemm_alignment(call, capability)
    if not (q.size(-1) == k.size(-1) and q.size(-1) % alignment == 0 and q.size(-1) > 0
            and v.size(-1) % alignment == 0 and v.size(-1) > 0):
        return ("Mem efficient attention requires last dimension of inputs to be divisible by "
                f"{alignment}. Got Query.size(-1): {q.size(-1)}, Key.size(-1): {k.size(-1)}, "
                f"Value.size(-1): {v.size(-1)} instead.")
    if capability[0] >= 8:
        step = alignment * q.element_size()
        offsets = [t.storage_offset() * t.element_size() for t in (q, k, v)]
        if any(t.numel() and offset % step for t, offset in zip((q, k, v), offsets)):
            return ("Mem efficient attention on sm80 or newer requires q, k, and v storage "
                    f"offsets * element_size to be aligned to {step} bytes. Got "
                    "query.storage_offset() * element_size % alignment_bytes: "
                    f"{offsets[0] % step}, "
                    f"key.storage_offset() * element_size % alignment_bytes: {offsets[1] % step}, "
                    f"value.storage_offset() * element_size % alignment_bytes: "
                    f"{offsets[2] % step}.")
    reason = (_nonzero_sequences(call) or _last_stride_one(call, ignore_singleton=False)
              or _batch_and_heads(call))
    if reason:
        return reason
    allowed = ((torch.float16, torch.float32, torch.bfloat16) if capability[0] >= 8
               else (torch.float16, torch.float32))
    return _dtypes(call, allowed)


def device_capability() -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability())


def _answer(reason: str, debug: bool, check: str) -> bool:
    if reason and debug:
        # torch binds the queries without a Python warning handler, so CUDA's TORCH_WARN reaches
        # c10's default handler and stderr, not `warnings` (H100, torch 2.11: nothing recorded).
        now = datetime.datetime.now()
        sys.stderr.write(f"[W{now:%m%d %H:%M:%S}.{now.microsecond * 1000:09d} sdp_utils.cpp] "
                         f"Warning: {reason} (function {check})\n")
    return not reason


def can_use_flash_attention(state, params, debug: bool = False) -> bool:
    """`torch._C._can_use_flash_attention`, behind `torch.backends.cuda.can_use_flash_attention`."""
    call = AttentionCall.of_params(params)
    return _answer(flash_refusal(call, device_capability(),
                                 torch.backends.cuda.flash_sdp_enabled()), debug,
                   "can_use_flash_attention")


def can_use_efficient_attention(state, params, debug: bool = False) -> bool:
    """`torch._C._can_use_mem_efficient_attention`."""
    call = AttentionCall.of_params(params)
    return _answer(efficient_refusal(call, device_capability(),
                                     torch.backends.cuda.mem_efficient_sdp_enabled()), debug,
                   "can_use_mem_efficient_attention")


def can_use_cudnn_attention(state, params, debug: bool = False) -> bool:
    """`torch._C._can_use_cudnn_attention`: not modelled."""
    raise UnsupportedOnEmulatedDevice(
        "torch.backends.cuda.can_use_cudnn_attention on the emulated CUDA device: cuDNN "
        "attention's filters depend on the cuDNN release the wheel ships (head dimensions, "
        "layouts, dropout), which a machine without a GPU cannot tell; ask "
        "can_use_flash_attention or can_use_efficient_attention, or run this on a GPU")


# CUDA's fused attention kernels' own ops, which `torch.nn.functional.scaled_dot_product_attention`
# calls on CUDA and some code calls directly after a `can_use_*` query (torch's CausalBias does).
_FUSED_OP_NAMES = (
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_flash_attention_forward",
    "_efficient_attention_forward", "_cudnn_attention_forward",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention_backward", "_flash_attention_backward",
    "_efficient_attention_backward")


def _fused_ops() -> dict:
    """Each op of `_FUSED_OP_NAMES` this torch has, as its packet and its overloads (a call
    through `torch.ops.aten` reaches the device as either), by its name."""
    found = {}
    for name in _FUSED_OP_NAMES:
        packet = getattr(torch.ops.aten, name, None)
        if packet is None:
            continue
        found[packet] = name
        found.update({getattr(packet, overload): name for overload in packet.overloads()})
    return found


FUSED_OPS = _fused_ops()


def fused_op_refused(func) -> UnsupportedOnEmulatedDevice:
    """The refusal of a fused attention kernel's own op called with device tensors: a CPU build
    has no such kernel, and the dispatcher's answer named the CPU backend, not the emulation."""
    name = FUSED_OPS[func]
    return UnsupportedOnEmulatedDevice(
        f"aten::{name} on the emulated CUDA device: CUDA's fused attention kernels are not in a "
        f"CPU build of torch. Call torch.nn.functional.scaled_dot_product_attention, which the "
        f"emulated device runs as CUDA chooses its kernel (the CPU's kernels computing), or run "
        f"this on a GPU")


def flash_attention_available(state) -> bool:
    """CUDA's Linux wheels are built with flash attention (`USE_FLASH_ATTENTION`)."""
    return True


def refusal_of_the_allowed_kernels(call: AttentionCall) -> str:
    """With the math kernel and cuDNN's switched off, CUDA's "No available kernel" reasons when
    neither fused kernel left takes the call (the warnings `select_sdp_backend` gives before
    refusing), or "" where one does or another kernel is allowed."""
    backends = torch.backends.cuda
    if backends.math_sdp_enabled() or backends.cudnn_sdp_enabled() or not (
            backends.flash_sdp_enabled() or backends.mem_efficient_sdp_enabled()):
        return ""  # a kernel CUDA may run, or none allowed: torch's own answer
    capability = device_capability()
    efficient = efficient_refusal(call, capability, backends.mem_efficient_sdp_enabled())
    flash = flash_refusal(call, capability, backends.flash_sdp_enabled())
    if not (efficient and flash):
        return ""
    return (f"Memory efficient kernel not used because: {efficient} Flash attention kernel not "
            f"used because: {flash} cuDNN attention kernel not used because: cuDNN attention has "
            f"been runtime disabled.")
