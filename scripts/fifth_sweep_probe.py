"""CUDA's own answers for the cases of the fifth sweep of public runtimes and bugs (docs/fidelity.md,
"A fifth sweep of public runtimes and bugs"): runtime shapes the earlier sweeps left out, the cases
decided from PyTorch's source (linear algebra's info checks, `matrix_exp`, `repeat_interleave`'s
`output_size`, the int4 layout), and the cases whose CUDA answer is not known here.

Plain torch, no harness: run it on a GPU, `python scripts/fifth_sweep_probe.py` (all cases, each in
a process of its own, since a refused capture can leave CUDA's context unusable) or with case names.
Each case prints one line `case: answer`, with the emulated device's answer in brackets; compare
with `python scripts/fifth_sweep_probe.py --emulate` on a machine without a GPU. "(unknown)" marks
the cases whose CUDA answer the emulated device's may not match."""

from __future__ import annotations

import sys
import threading
from unittest import mock

import probe_cases
import torch

CASES, case = probe_cases.registry()

_outcome = probe_cases.outcome


_warmed_capture = probe_cases.warmed_capture
_capture_verdict = probe_cases.capture_verdict


def _in_a_thread(work) -> None:
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()


def _graph_adding_one() -> tuple[torch.Tensor, torch.cuda.CUDAGraph]:
    x = torch.ones(4, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x.add_(1)
    return x, graph


def _spd(n: int = 8, seed: int = 0) -> torch.Tensor:
    m = torch.randn(n, n, generator=torch.Generator().manual_seed(seed))
    return (m @ m.mT + n * torch.eye(n)).to("cuda")


# --- linear algebra in a capture (PyTorch #96632, #195731) -----------------------------------

@case
def linalg_solve_in_capture():
    a, b = _spd(), torch.ones(8, 1, device="cuda")
    return (f"{_capture_verdict(lambda: torch.linalg.solve(a, b))} (emulated: op "
            f"CaptureSyncError operation not permitted ...; end: invalidated)")


@case
def linalg_solve_ex_in_capture():
    a, b = _spd(), torch.ones(8, 1, device="cuda")
    graph, (x, info) = _warmed_capture(lambda: torch.linalg.solve_ex(a, b))
    a.copy_(_spd(seed=1))
    graph.replay()
    return (f"replay equals eager: {torch.allclose(x, torch.linalg.solve(a, b), atol=1e-5)}, "
            f"info {info.item()} (emulated: True, 0)")


@case
def linalg_eigh_svd_cholesky_inv_in_capture():
    a = _spd()
    verdicts = {name: _capture_verdict(lambda op=op: op(a))[:60] for name, op in (
        ("eigh", torch.linalg.eigh), ("svd", torch.linalg.svd), ("cholesky", torch.linalg.cholesky),
        ("inv", torch.linalg.inv), ("pinv", torch.linalg.pinv))}
    return f"{verdicts} (emulated: each refused as a sync, the capture invalidated)"


@case
def linalg_eig_in_capture():
    a = _spd()
    return (f"{_capture_verdict(lambda: torch.linalg.eigvals(a))} (unknown: MAGMA's path copies "
            f"to the host, cuSOLVER's checks info; emulated: refused as a sync)")


@case
def linalg_ex_ops_in_capture():
    a, b = _spd(), torch.ones(8, 2, device="cuda")
    verdicts = {name: _capture_verdict(lambda op=op: op())[:40] for name, op in (
        ("cholesky_ex", lambda: torch.linalg.cholesky_ex(a)),
        ("inv_ex", lambda: torch.linalg.inv_ex(a)),
        ("lu_factor_ex+lu_solve", lambda: torch.linalg.lu_solve(*torch.linalg.lu_factor_ex(a)[:2], b)),
        ("det", lambda: torch.linalg.det(a)), ("qr", lambda: torch.linalg.qr(a)),
        ("cholesky_solve", lambda: torch.cholesky_solve(b, torch.linalg.cholesky_ex(a)[0])))}
    return f"{verdicts} (emulated: all captured; qr and cholesky_solve unknown)"


@case
def first_solver_call_inside_a_capture():
    a = _spd()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            torch.linalg.cholesky_ex(a)
        return "captured (unknown: a cuSOLVER handle made inside the capture; emulated: captured)"
    except RuntimeError as error:
        return (f"{type(error).__name__}: {str(error).splitlines()[0][:120]} (unknown; emulated: "
                f"captured)")


@case
def matrix_exp_in_capture():
    a = _spd() / 100
    single = _capture_verdict(lambda: torch.linalg.matrix_exp(a))
    batch = _capture_verdict(lambda: torch.linalg.matrix_exp(a.expand(3, 8, 8).contiguous()))
    return (f"one matrix: {single}; a batch of 3: {batch} (emulated: both Copy.cu's pageable-copy "
            f"refusal, the capture still valid)")


@case
def histc_in_capture():
    x = torch.randn(100, device="cuda")
    return (f"without a range: {_capture_verdict(lambda: torch.histc(x, bins=8))}; with one: "
            f"{_capture_verdict(lambda: torch.histc(x, bins=8, min=-3, max=3))} (emulated: "
            f"Copy.cu's pageable-copy refusal, the capture still valid; captured)")


@case
def ctc_loss_in_capture():
    log_probs = torch.randn(10, 2, 5, device="cuda").log_softmax(2)
    targets = torch.ones(2, 3, dtype=torch.long, device="cuda")
    lengths = torch.tensor([10, 10]), torch.tensor([3, 3])
    on_device = tuple(t.cuda() for t in lengths)
    ctc = torch.nn.functional.ctc_loss
    return (f"host lengths: {_capture_verdict(lambda: ctc(log_probs, targets, *lengths))}; device "
            f"lengths: {_capture_verdict(lambda: ctc(log_probs, targets, *on_device))}; int lists: "
            f"{_capture_verdict(lambda: ctc(log_probs, targets, [10, 10], [3, 3]))} (decided from "
            f"LossCTC.cu and LossCTC.cpp: Copy.cu's pageable-copy refusal of `at::tensor(lengths)` "
            f"or of the device lengths' `.to(kCPU)`, the capture still valid; emulated: the same)")


@case
def ctc_loss_on_cudnns_path_in_capture():
    log_probs = torch.randn(10, 2, 5, device="cuda").log_softmax(2)
    targets = torch.ones(6, dtype=torch.int32)  # 1-D int32 on the host, blank 0: cuDNN's conditions
    ctc = torch.nn.functional.ctc_loss
    return (f"reduction='sum': {_capture_verdict(lambda: ctc(log_probs, targets, [10, 10], [3, 3], reduction='sum'))}; "
            f"'mean': {_capture_verdict(lambda: ctc(log_probs, targets, [10, 10], [3, 3]))} "
            f"(unknown: cudnnCTCLoss with host labels; emulated: never takes cuDNN's path, Copy.cu's "
            f"pageable-copy refusal, the capture still valid)")


@case
def orthogonal_parametrization_in_capture():
    layer = torch.nn.utils.parametrizations.orthogonal(torch.nn.Linear(8, 8)).cuda()
    x = torch.randn(4, 8, device="cuda")
    with torch.no_grad():
        verdict = _capture_verdict(lambda: layer(x))
    return f"{verdict} (emulated: matrix_exp's pageable-copy refusal)"


@case
def sync_debug_mode_on_solvers():
    a = _spd()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        flagged = {}
        for name, op in (("inv", torch.linalg.inv), ("inv_ex", torch.linalg.inv_ex),
                         ("matrix_exp", torch.linalg.matrix_exp),
                         ("repeat_interleave output_size", lambda t: torch.repeat_interleave(
                             torch.full((4,), 2, device="cuda"), output_size=8))):
            try:
                op(a)
                flagged[name] = False
            except RuntimeError:
                flagged[name] = True
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return f"{flagged} (emulated: inv True, inv_ex False, matrix_exp True, repeat_interleave False)"


# --- repeat_interleave, multinomial, distributions -------------------------------------------

@case
def repeat_interleave_with_output_size_in_capture():
    counts = torch.tensor([2, 2, 2, 2], device="cuda")
    experts = torch.arange(4, device="cuda")
    graph, slots = _warmed_capture(lambda: torch.repeat_interleave(experts, counts, output_size=8))
    counts.copy_(torch.tensor([1, 0, 4, 3]))
    graph.replay()
    torch.cuda.synchronize()
    unsized = _capture_verdict(lambda: torch.repeat_interleave(experts, counts))
    return (f"sized: {slots.tolist()}; unsized: {unsized[:70]} (emulated: [0, 2, 2, 2, 2, 3, 3, "
            f"3]; unsized refused as a sync)")


@case
def multinomial_in_capture():
    probs = torch.softmax(torch.randn(4, 50, device="cuda"), -1)
    graph, sample = _warmed_capture(lambda: torch.multinomial(probs, 1))
    draws = []
    for _ in range(4):
        graph.replay()
        draws.append(sample.flatten().tolist())
    without = _capture_verdict(lambda: torch.multinomial(probs, 3))
    return (f"num_samples=1 captured, replays differ: {len({tuple(d) for d in draws}) > 1}; "
            f"num_samples=3: {without} (emulated: True; captured)")


@case
def categorical_sample_in_capture():
    logits = torch.randn(4, 6, device="cuda")
    validated = _capture_verdict(lambda: torch.distributions.Categorical(logits=logits).sample())
    unvalidated = _capture_verdict(
        lambda: torch.distributions.Categorical(logits=logits, validate_args=False).sample())
    return (f"validated: {validated[:80]}; validate_args=False: {unvalidated} (emulated: refused "
            f"as a sync; captured)")


# --- the int4 weight-only matmul (gpt-fast int4, torchao tinygemm) ----------------------------

@case
def int4_weight_only_matmul():
    generator = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (24, 256), dtype=torch.int32, generator=generator)
    packed = torch.ops.aten._convert_weight_to_int4pack(
        (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8).cuda(), 8)
    info = torch.stack((torch.rand(4, 24, generator=generator) / 8 + 0.01,
                        torch.randn(4, 24, generator=generator) / 4), -1).to(torch.bfloat16)
    x = torch.randn(3, 256, generator=generator).to(torch.bfloat16)
    y = torch._weight_int4pack_mm(x.cuda(), packed, 64, info.cuda())
    groups = torch.arange(256) // 64
    weight = ((q - 8).float() * info[groups, :, 0].t().float() + info[groups, :, 1].t().float())
    reference = x.float() @ weight.to(torch.bfloat16).float().t()
    bits = packed.flatten()[:6].tolist()
    return (f"packed {tuple(packed.shape)} first words {bits}; max |y - dequantized matmul| "
            f"{(y.cpu().float() - reference).abs().max().item():.3f} of max {reference.abs().max().item():.1f} "
            f"(emulated: the same words; an error within bfloat16's rounding)")


# --- runtimes' capture code -----------------------------------------------------------------

@case
def tensordict_cudagraph_module_shape():
    """tensordict's CudaGraphModule: warmup on a side stream with synchronize around it, the
    inputs cloned into static buffers, `_foreach_copy_` to refill them, outputs cloned."""
    weight = torch.randn(16, 16, device="cuda")

    def module(x, h):
        return torch.tanh(x @ weight + h), (x * 2).sum(-1)

    args = [torch.randn(4, 16, device="cuda"), torch.randn(4, 16, device="cuda")]
    static = [a.clone() for a in args]
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        module(*static)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = module(*static)
    right = []
    for seed in range(3):
        new = [torch.randn(4, 16, device="cuda") for _ in range(2)]
        torch._foreach_copy_(static, new)
        torch.cuda.synchronize()
        graph.replay()
        got = [o.clone() for o in out]
        want = module(*new)
        right.append(all(torch.allclose(g, w, atol=1e-5) for g, w in zip(got, want)))
    return f"each replay equals eager: {right} (emulated: all True)"


@case
def mamba_capture_graph_shape():
    """mamba_ssm / flash-attn's `capture_graph`: one graph per decoding length in a shared
    `graph_pool_handle()`, `lengths_per_sample[:] = seqlen` before each replay, logits cloned."""
    vocab, dim, max_len = 32, 16, 12
    embed, head = torch.randn(vocab, dim, device="cuda"), torch.randn(dim, vocab, device="cuda")
    cache = torch.zeros(2, max_len, dim, device="cuda")
    lengths = torch.zeros(2, dtype=torch.long, device="cuda")

    def model(ids):
        h = embed[ids]  # [2, decoding, dim]
        position = lengths.view(2, 1) + torch.arange(ids.size(1), device="cuda")
        cache.scatter_(1, position.unsqueeze(-1).expand(-1, -1, dim), h)
        mask = (torch.arange(max_len, device="cuda") <= position[:, -1:]).float()
        context = (cache * mask.unsqueeze(-1)).sum(1) / mask.sum(-1, keepdim=True)
        return (context @ head)

    pool = torch.cuda.graphs.graph_pool_handle()
    runs = {}
    for decoding in (1, 2):
        ids = torch.zeros(2, decoding, dtype=torch.long, device="cuda")
        lengths[:] = max_len - decoding
        graph, logits = _warmed_capture(lambda ids=ids: model(ids), pool=pool)

        def run(new_ids, seqlen, ids=ids, graph=graph, logits=logits):
            lengths[:] = seqlen
            ids.copy_(new_ids)
            graph.replay()
            return logits.clone()

        runs[decoding] = run
    cache.zero_()
    tokens, generated = torch.tensor([[3], [5]], device="cuda"), []
    for step in range(4):
        tokens = runs[1](tokens, step).argmax(-1, keepdim=True)
        generated.append(tokens.flatten().tolist())
    cache.zero_()
    eager, tokens = [], torch.tensor([[3], [5]], device="cuda")
    for step in range(4):
        lengths[:] = step
        tokens = model(tokens).argmax(-1, keepdim=True)
        eager.append(tokens.flatten().tolist())
    return f"graphed tokens equal eager: {generated == eager} (emulated: True)"


@case
def vllm_capture_with_gc_and_empty_cache_patched():
    """vLLM's CUDAGraphWrapper after the first size: `gc.collect` and `torch.cuda.empty_cache`
    patched out around `torch.cuda.graph(..., pool=...)`, so the capture keeps the cache."""
    x = torch.randn(1 << 20, device="cuda")
    scratch = torch.empty(5 << 20, device="cuda")
    del scratch
    before = torch.cuda.memory_reserved()
    pool = torch.cuda.graph_pool_handle()
    graph = torch.cuda.CUDAGraph()
    with mock.patch("gc.collect", lambda: None), mock.patch("torch.cuda.empty_cache", lambda: None):
        with torch.cuda.graph(graph, pool=pool):
            y = x * 2
    kept = torch.cuda.memory_reserved() - before
    scratch = torch.empty(5 << 20, device="cuda")
    del scratch
    graph2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph2, pool=pool):
        y2 = x * 3
    released = torch.cuda.memory_reserved() - before
    del y, y2
    return (f"reserved after the patched capture: +{kept >> 20} MiB, after an unpatched one: "
            f"{released >> 20:+d} MiB (emulated: +22 MiB (the pool's 20 MiB segment and a 2 MiB one), then +2 MiB (the scratch released))")


@case
def deepspeed_inference_engine_shape():
    """DeepSpeed's InferenceEngine `_create_cuda_graph`: three warmups on a side stream, static
    inputs and kwargs captured, later calls copy into them and return the static output."""
    layer = torch.nn.Linear(16, 16).cuda()
    static_inputs = (torch.randn(2, 16, device="cuda"),)
    static_kwargs = {"scale": torch.ones(1, device="cuda")}

    def forward(x, scale):
        return layer(x) * scale

    with torch.no_grad():
        graph, static_output = _warmed_capture(lambda: forward(*static_inputs, **static_kwargs))
        right = []
        for seed in range(3):
            x, scale = torch.randn(2, 16, device="cuda"), torch.full((1,), seed + 1.0, device="cuda")
            static_inputs[0].copy_(x)
            static_kwargs["scale"].copy_(scale)
            graph.replay()
            right.append(torch.allclose(static_output, forward(x, scale), atol=1e-5))
    return f"each replay equals eager: {right} (emulated: all True)"


@case
def graph_reset_then_recapture_into_the_same_object():
    """A runtime that recaptures after a weight update (RL weight sync): `reset()`, then a new
    capture into the same CUDAGraph."""
    x, graph = _graph_adding_one()
    graph.reset()
    replay_after_reset = _outcome(graph.replay)
    with torch.cuda.graph(graph):
        x.mul_(3)
    x.fill_(1)
    graph.replay()
    torch.cuda.synchronize()
    return (f"replay after reset: {replay_after_reset}; recaptured replay {x.tolist()} (emulated: "
            f"RuntimeError ... without a preceding successful capture; [3.0, 3.0, 3.0, 3.0])")


@case
def replay_from_another_thread_on_its_stream():
    x, graph = _graph_adding_one()
    side, seen = torch.cuda.Stream(), {}

    def worker():
        with torch.cuda.stream(side):
            graph.replay()
        side.synchronize()
        seen["x"] = x.tolist()

    _in_a_thread(worker)
    return f"{seen} (emulated: {{'x': [2.0, 2.0, 2.0, 2.0]}})"


@case
def device_to_pinned_copy_inside_the_capture():
    """An async-output runtime that captures the sampled ids' copy to a pinned buffer."""
    logits = torch.randn(4, 10, device="cuda")
    host = torch.zeros(4, dtype=torch.long, pin_memory=True)
    graph, _ = _warmed_capture(lambda: host.copy_(logits.argmax(-1), non_blocking=True))
    logits.copy_(torch.randn(4, 10, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    return (f"pinned buffer after a replay equals the new argmax: "
            f"{host.tolist() == logits.argmax(-1).tolist()} (emulated: True)")


@case
def is_current_stream_capturing_from_another_thread():
    side, seen = torch.cuda.Stream(), {}

    def probe():
        seen["default stream"] = torch.cuda.is_current_stream_capturing()
        with torch.cuda.stream(side):
            seen["capturing stream"] = torch.cuda.is_current_stream_capturing()

    x = torch.ones(4, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side, capture_error_mode="relaxed"):
        x.add_(1)
        _in_a_thread(probe)
    return f"{seen} (emulated: default stream False, capturing stream True)"


@case
def transformer_encoder_fast_path_in_capture():
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).cuda().eval()
    x = torch.randn(2, 5, 16, device="cuda")
    with torch.no_grad():
        graph, out = _warmed_capture(lambda: layer(x))
        new = torch.randn(2, 5, 16, device="cuda")
        x.copy_(new)
        graph.replay()
        right = torch.allclose(out, layer(new), atol=1e-5)
    return f"replay equals eager: {right} (emulated: True)"


# --- CUDA answers not known here --------------------------------------------------------------

@case
def stream_priority_out_of_range():
    return (f"Stream(priority=5): {_outcome(lambda: torch.cuda.Stream(priority=5).priority)}; "
            f"Stream(priority=-100): {_outcome(lambda: torch.cuda.Stream(priority=-100).priority)} "
            f"(unknown; emulated: ok 0; ok -3)")


@case
def cudnn_benchmark_first_conv_inside_a_capture():
    torch.backends.cudnn.benchmark = True
    conv = torch.nn.Conv2d(3, 8, 3).cuda()
    x = torch.randn(2, 3, 16, 16, device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            conv(x)
        return "captured (unknown; emulated: captured, no benchmark)"
    except RuntimeError as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0][:120]} (unknown; emulated: captured)"


@case
def embedding_with_max_norm_in_capture():
    weight = torch.randn(10, 4, device="cuda")
    ids = torch.tensor([1, 2, 2, 5], device="cuda")
    return (f"{_capture_verdict(lambda: torch.nn.functional.embedding(ids, weight, max_norm=1.0))} "
            f"(unknown; emulated: see --emulate)")


@case
def scaled_mm_with_a_row_major_second_operand():
    a = torch.randn(16, 32, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(32, 16, device="cuda").to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    return (f"row-major mat2: {_outcome(lambda: tuple(torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16).shape))}; "
            f"column-major: {_outcome(lambda: tuple(torch._scaled_mm(a, b.t().contiguous().t(), one, one, out_dtype=torch.bfloat16).shape))} "
            f"(unknown; emulated: ok (16, 16) both)")


if __name__ == "__main__":
    probe_cases.run(CASES, __file__, sys.argv[1:], answer=_outcome)
