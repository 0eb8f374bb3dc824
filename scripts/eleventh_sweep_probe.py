"""CUDA's own answers for the cases of the eleventh sweep of public runtimes and bugs
(docs/fidelity.md, "An eleventh sweep of public runtimes and bugs"): which fused attention kernel
SDPA gives a call (the `torch.backends.cuda.can_use_*` queries, one backend allowed with
`sdpa_kernel`, `torch._fused_sdp_choice`), flash attention's dropout replayed in a graph, the
per-process memory fraction per device and its out-of-memory text, timing events around and inside
a capture, and the sync debug mode on a training step's calls.

Plain torch, no harness: run it on a GPU, `python scripts/eleventh_sweep_probe.py` (all cases,
each in a process of its own) or with case names. Each case prints one line `case: answer`, with
the emulated device's answer in brackets where it is known to differ or was fixed; compare with
`python scripts/eleventh_sweep_probe.py --emulate` on a machine without a GPU."""

from __future__ import annotations

import sys
import warnings

import probe_cases
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

CASES, case = probe_cases.registry()

_outcome = probe_cases.outcome


def _qkv(heads=2, length=8, head_dim=64, dtype=torch.float16, seed=0, kv_heads=None,
         kv_length=None):
    q = probe_cases.seeded(1, heads, length, head_dim, seed=seed).to(dtype)
    kv = probe_cases.seeded(1, kv_heads or heads, kv_length or length, head_dim,
                            seed=seed + 1).to(dtype)
    return q, kv, kv


_SHAPES = {
    "fp16 causal": (lambda: _qkv(), {"is_causal": True}),
    "bf16": (lambda: _qkv(dtype=torch.bfloat16), {}),
    "fp32": (lambda: _qkv(dtype=torch.float32), {}),
    "fp64": (lambda: _qkv(dtype=torch.float64), {}),
    "fp16 head_dim 60": (lambda: _qkv(head_dim=60), {}),
    "fp16 head_dim 300": (lambda: _qkv(head_dim=300), {}),
    "fp16 causal q 4 kv 8": (lambda: _qkv(length=4, kv_length=8), {"is_causal": True}),
    "fp16 gqa 4/2": (lambda: _qkv(heads=4, kv_heads=2), {"enable_gqa": True}),
    "fp16 dropout 0.1": (lambda: _qkv(), {"dropout_p": 0.1}),
    "fp16 dropout 0.125": (lambda: _qkv(), {"dropout_p": 0.125}),
    "fp16 bool mask": (lambda: _qkv(), {"attn_mask": "tril"}),
    "fp16 BSHD layout": (lambda: tuple(t.transpose(1, 2).contiguous().transpose(1, 2)
                                       for t in _qkv()), {}),
    "fp16 offset 4": (lambda: tuple(probe_cases.seeded(1, 2, 8, 68, seed=s).half()[..., 4:]
                                    for s in (0, 1, 2)), {}),
}


def _made(name: str):
    """The case's q, k, v and SDPA keywords (a mask is made on the device here, not at import)."""
    make, kwargs = _SHAPES[name]
    if kwargs.get("attn_mask") == "tril":
        kwargs = {**kwargs, "attn_mask": torch.ones(8, 8, dtype=torch.bool, device="cuda").tril()}
    return (*make(), kwargs)


def _params(q, k, v, kwargs):
    return torch.backends.cuda.SDPAParams(q, k, v, kwargs.get("attn_mask"),
                                          kwargs.get("dropout_p", 0.0),
                                          kwargs.get("is_causal", False),
                                          kwargs.get("enable_gqa", False))


def _asked(check, params) -> str:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        answer = _outcome(lambda: check(params, True))
    reasons = [str(w.message).split(" (Triggered")[0][:70] for w in caught
               if issubclass(w.category, UserWarning)]
    return f"{answer} {reasons}" if reasons else answer


@case
def sdpa_can_use_queries():
    """sdp_utils.cpp's can_use_flash_attention / can_use_mem_efficient_attention /
    can_use_cudnn_attention, with their debug warnings."""
    b = torch.backends.cuda
    lines = [f"flash available {b.is_flash_attention_available()}"]
    for name in _SHAPES:
        params = _params(*_made(name))
        lines.append(f"[{name}] flash {_asked(b.can_use_flash_attention, params)}; efficient "
                     f"{_asked(b.can_use_efficient_attention, params)}; cudnn "
                     f"{_asked(b.can_use_cudnn_attention, params)}")
    return (" | ".join(lines) + " (emulated: flash and efficient by the model; cudnn refused by "
            "name, UnsupportedOnEmulatedDevice)")


def _only(backends) -> str:
    answers = []
    for name in _SHAPES:
        q, k, v, kwargs = _made(name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with sdpa_kernel(backends):
                answers.append(f"[{name}] " + _outcome(
                    lambda: tuple(F.scaled_dot_product_attention(q, k, v, **kwargs).shape)))
    return " | ".join(answers)


@case
def sdpa_flash_attention_alone():
    return (_only([SDPBackend.FLASH_ATTENTION]) + " (emulated: runs dropout, GQA, bf16/fp16; "
            "refuses fp32, fp64, head_dim 300, the causal 4/8 call, the mask)")


@case
def sdpa_efficient_attention_alone():
    return (_only([SDPBackend.EFFICIENT_ATTENTION]) + " (emulated: refuses fp64 and head_dim "
            "60/300; runs the rest, GQA included)")


@case
def sdpa_cudnn_attention_alone():
    return (_only([SDPBackend.CUDNN_ATTENTION]) + " (emulated: runs every call; cuDNN's "
            "filters are not modelled)")


@case
def sdpa_fused_choice():
    """select_sdp_backend's answer with every backend on (0 math, 1 flash, 2 efficient, 3 cudnn)."""
    answers = []
    for name in _SHAPES:
        q, k, v, kwargs = _made(name)
        answers.append(f"[{name}] " + _outcome(lambda: torch._fused_sdp_choice(q, k, v, **kwargs)))
    return " | ".join(answers) + " (emulated: the CPU's choice, not modelled)"


@case
def causal_bias_lower_right_eager_and_graphed():
    """torch.nn.attention.bias: a lower-right bias of unequal lengths goes to the fused kernels'
    own ops where can_use_* says so."""
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left

    answers = {}
    for dtype in (torch.float16, torch.float32):
        q, k, v = _qkv(length=4, kv_length=8, dtype=dtype)
        bias = causal_lower_right(4, 8)
        reference = F.scaled_dot_product_attention(q, k, v, attn_mask=bias._materialize(q.device))
        answers[str(dtype)] = _outcome(lambda: (F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias) - reference).abs().max().item() < 2e-2)
    q, k, v = _qkv(length=4, kv_length=8)
    bias = causal_lower_right(4, 8)
    graph, out = probe_cases.warmed_capture(
        lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias))
    q.copy_(probe_cases.seeded(1, 2, 4, 64, seed=5).half())
    graph.replay()
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias._materialize(q.device))
    answers["graphed"] = (out - expected).abs().max().item() < 2e-2
    q32, k32, v32 = _qkv(length=4, kv_length=8, dtype=torch.float32)
    with torch.autocast("cuda", dtype=torch.float16):
        answers["autocast dtypes (lower, upper)"] = _outcome(lambda: tuple(
            str(F.scaled_dot_product_attention(q32, k32, v32, attn_mask=make(4, 8)).dtype)
            for make in (causal_lower_right, causal_upper_left)))
    side = torch.cuda.Stream()
    answers["made after a side stream"] = type(causal_lower_right(4, 8)).__name__
    del side
    answers["flash op direct"] = _outcome(lambda: tuple(
        torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[0].shape))
    return (f"{answers} (emulated before: mixed-devices RuntimeError for every call, and "
            f"CausalBias refused after a side stream; now True, True, True, (float32, float16), "
            f"CausalBias; the flash op direct: UnsupportedOnEmulatedDevice)")


@case
def flash_dropout_replayed_in_a_graph():
    q, k, v = _qkv(length=64)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    offsets = []
    firsts = []
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        firsts.append(out.clone())
        offsets.append(int(torch.cuda.get_rng_state().view(torch.int64)[1]))
    return (f"replays differ {not torch.equal(firsts[0], firsts[1])}; rng offsets after each "
            f"replay {offsets} (emulated before: No available kernel; now the math kernel's "
            f"dropout stands in, replays differ)")


@case
def memory_fraction_per_device():
    count = torch.cuda.device_count()
    answers = {
        "set missing": _outcome(lambda: torch.cuda.set_per_process_memory_fraction(0.5, count)),
        "get missing": _outcome(lambda: torch.cuda.get_per_process_memory_fraction(count)),
    }
    if count > 1:
        torch.cuda.set_per_process_memory_fraction(0.25, 1)
        answers["after set(0.25, 1)"] = (torch.cuda.get_per_process_memory_fraction(0),
                                         torch.cuda.get_per_process_memory_fraction(1))
        torch.cuda.set_per_process_memory_fraction(1.0, 1)
    return f"{answers} (emulated before: set missing ok None, get missing ok, one share for all)"


@case
def out_of_memory_text_under_a_fraction():
    torch.cuda.set_per_process_memory_fraction(1e-4)
    try:
        text = probe_cases.whole_answer(
            lambda: str(torch.empty(1 << 26, dtype=torch.uint8, device="cuda").shape))
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    return (f"{text} (emulated: 'CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 has a "
            f"total capacity of ... of which ... is free.' and the fraction's note)")


@case
def timing_events_in_and_around_a_capture():
    x = torch.ones(1 << 20, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    answers = {}
    try:
        with torch.cuda.graph(graph):
            answers["record in capture"] = _outcome(start.record)
            x.mul_(2)
            answers["record end"] = _outcome(end.record)
            answers["elapsed inside"] = _outcome(lambda: start.elapsed_time(end))
        answers["capture end"] = "ok"
    except RuntimeError as error:
        answers["capture end"] = f"{type(error).__name__}: {str(error).splitlines()[0][:90]}"
    if answers["capture end"] == "ok":
        graph.replay()
        torch.cuda.synchronize()
        answers["elapsed after replay"] = _outcome(lambda: start.elapsed_time(end))
    before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    before.record()
    answers["unrecorded end"] = _outcome(lambda: before.elapsed_time(after))
    return (f"{answers} (emulated: records ok; elapsed inside CaptureError cudaErrorCapturedEvent, "
            f"the capture invalidated; a capture without that call: elapsed after replay "
            f"CapturedEventError 'invalid argument'; unrecorded end ValueError)")


@case
def sync_debug_mode_on_a_training_step():
    p = torch.nn.Parameter(probe_cases.seeded(64))
    p.grad = probe_cases.seeded(64, seed=1)
    probs = probe_cases.seeded(4, 50).softmax(-1)
    calls = {
        "multinomial(3) without replacement": lambda: torch.multinomial(probs, 3),
        "randperm(20000)": lambda: torch.randperm(20000, device="cuda"),
        "clip_grad_norm_": lambda: torch.nn.utils.clip_grad_norm_([p], 1.0),
        "clip_grad_norm_(error_if_nonfinite)": lambda: torch.nn.utils.clip_grad_norm_(
            [p], 1.0, error_if_nonfinite=True),
        "GradScaler.unscale_": lambda: _unscaled(p),
        "Adam(capturable).step": lambda: torch.optim.Adam([p], capturable=True).step(),
        "Adam.step": lambda: torch.optim.Adam([p]).step(),
    }
    flagged = {name: _outcome(lambda call=call: probe_cases.flags_a_sync(call))
               for name, call in calls.items()}
    return f"{flagged} (emulated: only clip_grad_norm_(error_if_nonfinite) flagged)"


def _unscaled(p):
    scaler = torch.amp.GradScaler("cuda")
    optimizer = torch.optim.SGD([p], lr=0.1)
    scaler.scale(p.sum())
    scaler.unscale_(optimizer)


@case
def cudnn_answers():
    return (f"is_available {torch.backends.cudnn.is_available()}, version "
            f"{torch.backends.cudnn.version()}, enabled {torch.backends.cudnn.enabled} (emulated: "
            f"False, the build's version (None on the CPU wheel), True)")


if __name__ == "__main__":
    probe_cases.run(CASES, __file__, sys.argv[1:], answer=probe_cases.whole_answer)
