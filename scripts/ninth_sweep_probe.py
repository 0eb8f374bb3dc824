"""CUDA's own answers for the cases of the ninth sweep of public runtimes and bugs (docs/fidelity.md,
"A ninth sweep of public runtimes and bugs"): whole runtime-shaped programs (a gpt-fast decode loop
with a static KV cache, captured by hand and by `torch.compile(mode="reduce-overhead")`; an
SGLang-style CudaGraphRunner with one pool, a side capture stream and `torch.accelerator` calls; a
vLLM V1-style CUDAGraphWrapper with weakly referenced outputs; a TensorRT-LLM-style runner padding
dummy requests and forking a stream inside the capture; draft and verify graphs of speculative
decoding; transformers' `generate` with a static cache), the device-generic calls such runtimes
and PyTorch's test_accelerator.py make (`torch.get_device_module()`, `torch.accelerator.*`,
`torch.Stream()`, device contexts in a fullgraph compile), and two public bugs (a device tensor
printed inside a capture, SGLang #2460; an output of a reduce-overhead graph read after the next
step, transformers PR #30775 and #48199).

Plain torch, no harness: run it on a GPU, `python scripts/ninth_sweep_probe.py` (all cases, each
in a process of its own) or with case names. Each case prints one line `case: answer`, with the
emulated device's answer in brackets; compare with `python scripts/ninth_sweep_probe.py --emulate`
on a machine without a GPU."""

from __future__ import annotations

import gc
import sys

import probe_cases
import torch
import torch.nn as nn
import torch.nn.functional as F

CASES, case = probe_cases.registry()

_outcome = probe_cases.outcome
_seeded = probe_cases.seeded


# --- device-generic calls ---------------------------------------------------------------------

@case
def accelerator_generic_calls():
    module = torch.get_device_module()
    calls = {
        "get_device_module()": lambda: module.__name__,
        "_get_accelerator()": lambda: str(torch._C._get_accelerator()),
        "get_memory_info total": lambda: torch.accelerator.get_memory_info()[1]
        == torch.cuda.get_device_properties(0).total_memory,
        "get_device_capability": lambda: torch.accelerator.get_device_capability(),
        "empty_host_cache": lambda: torch.accelerator.empty_host_cache(),
        "reset_accumulated_memory_stats": lambda: torch.accelerator.reset_accumulated_memory_stats(),
        "Graph()": lambda: torch.accelerator.Graph(),
    }
    return (f"{ {n: _outcome(c)[:90] for n, c in calls.items()} } (emulated: 'torch.cuda'; 'cuda' (since "
            f"branch compiled10; the distributed barrier gets the build's cpu); "
            f"True; RuntimeError: Backend doesn't support getting device capabilities.; ok None; ok "
            f"None; RuntimeError: Graph is not supported on device type: cuda, read from torch "
            f"2.14.1's CUDA wheel, which registers no graph implementation)")


@case
def accelerator_streams_and_device_arguments():
    first, second = torch.Stream(), torch.Stream()
    previous = torch.accelerator.current_stream()
    torch.accelerator.set_stream(first)
    current_is_first = torch.accelerator.current_stream() == first
    torch.accelerator.set_stream(previous)
    rebuilt = torch.Stream(stream_id=first.stream_id, device_index=first.device_index,
                           device_type=first.device_type)
    with second:
        entered = torch.accelerator.current_stream() == second
    torch.ones(1, device="cuda")
    on_cpu = torch.device("cpu")
    set_cpu = _outcome(lambda: torch.accelerator.set_device_index("cpu"))[:70]
    stream_of_cpu = _outcome(lambda: torch.accelerator.current_stream(on_cpu))[:70]
    return (f"type {type(first).__name__}, a torch.cuda.Stream "
            f"{isinstance(first, torch.cuda.Stream)}; current == set {current_is_first}; "
            f"== rebuilt {first == rebuilt}; entered {entered}; set_device_index('cpu'): "
            f"{set_cpu}; current_stream(cpu): {stream_of_cpu}; allocator initialized "
            f"{torch._C._accelerator_isAllocatorInitialized()} (emulated: AcceleratorStream, a "
            f"torch.Stream subclass, False; True; True; True; ValueError: cpu doesn't match the "
            f"current accelerator cuda.; the same; True)")


@case
def device_contexts_in_a_fullgraph_compile():
    x = torch.randn(2, 2, device="cuda")
    answers = {}
    for name, context in (("torch.cuda.device", torch.cuda.device),
                          ("torch.accelerator.device_index",
                           getattr(torch.accelerator, "device_index", None))):
        if context is None:
            continue

        def fn(t, _context=context):
            with _context(t.device.index):
                return torch.sin(t + 1)

        torch._dynamo.reset()
        answers[name] = _outcome(lambda: torch.allclose(
            torch.compile(fn, backend="eager", fullgraph=True)(x), fn(x)))[:80]
    return f"{answers} (emulated: ok True for both; before this sweep 'Unexpected type in sourceless builder')"


@case
def device_read_inside_a_compiled_function():
    def fn(t):
        return t + 1 if t.device.type == "cuda" else t - 1

    x = torch.zeros(2, device="cuda")
    return (f"eager {fn(x).tolist()}, compiled {torch.compile(fn, backend='eager')(x).tolist()} "
            f"(emulated: eager [1.0, 1.0], compiled [1.0, 1.0] since branch "
            f"compiled10: dynamo's tensor variables answer where the value lives on CUDA)")


@case
def streams_events_and_indices_inside_a_compiled_function():
    x, host, side = torch.ones(4, device="cuda"), torch.ones(4), torch.cuda.Stream()

    def on_a_stream(t):
        with torch.cuda.stream(side):
            y = t * 2
        torch.cuda.current_stream().wait_stream(side)
        return y + 1

    def with_an_event(t):
        event = torch.cuda.Event()
        event.record()
        y = t * 3
        event.wait()
        return y

    cases = {"stream context": lambda: torch.compile(on_a_stream, backend="eager")(x).tolist(),
             "event": lambda: torch.compile(with_an_event, backend="eager")(x).tolist(),
             "x.to(0)": lambda: str(torch.compile(lambda t: t.to(0) + 1, backend="eager")(host).device)}
    return (f"{ {n: _outcome(c)[:90] for n, c in cases.items()} } (emulated: [3.0]*4 each, "
            f"'cuda:0', on both wheels since branch compiled10)")


# --- runtime-shaped programs ------------------------------------------------------------------

class _TinyDecoder(nn.Module):
    """gpt-fast's shape: a static KV cache written with index_copy_, SDPA over it, a causal mask."""

    def __init__(self, vocab=64, dim=32, heads=4, max_seq=32):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.emb, self.wqkv = nn.Embedding(vocab, dim), nn.Linear(dim, 3 * dim, bias=False)
        self.wo, self.out = nn.Linear(dim, dim, bias=False), nn.Linear(dim, vocab, bias=False)
        self.register_buffer("mask", torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool)))
        self.register_buffer("k_cache", torch.zeros(1, heads, max_seq, self.head_dim))
        self.register_buffer("v_cache", torch.zeros(1, heads, max_seq, self.head_dim))

    def forward(self, idx, pos):
        b, s = idx.shape
        q, k, v = self.wqkv(self.emb(idx)).split(self.heads * self.head_dim, dim=-1)
        q, k, v = (t.view(b, s, self.heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        y = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache,
                                           attn_mask=self.mask[None, None, pos])
        logits = self.out(self.wo(y.transpose(1, 2).reshape(b, s, -1)))
        probs = torch.softmax(logits[0, -1], -1)
        noise = torch.empty_like(probs).exponential_(1)  # gpt-fast's sync-free sampling
        return torch.argmax(probs / noise, -1, keepdim=True)[None] * 0 + logits[0, -1].argmax()


def _decode(model, step, n=8):
    tokens, pos = [int(torch.tensor([1, 5, 7], device="cuda").sum())], torch.tensor([3], device="cuda")
    model(torch.tensor([[1, 5, 7]], device="cuda"), torch.arange(3, device="cuda"))
    current = torch.tensor([[tokens[0] % 64]], device="cuda")
    for _ in range(n):
        current = step(model, current, pos).clone().view(1, 1)
        pos += 1
        tokens.append(int(current))
    return tokens


@case
def gpt_fast_decode_loop():
    torch.manual_seed(0)
    model = _TinyDecoder().cuda().eval()
    with torch.no_grad():
        eager = _decode(model, lambda m, x, p: m(x, p))
        static = {}

        def graphed(m, x, p):
            if not static:
                static["x"], static["p"] = x.clone(), p.clone()
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(2):
                        m(static["x"], static["p"])
                torch.cuda.current_stream().wait_stream(side)
                static["g"] = torch.cuda.CUDAGraph()
                with torch.cuda.graph(static["g"]):
                    static["out"] = m(static["x"], static["p"])
            static["x"].copy_(x)
            static["p"].copy_(p)
            static["g"].replay()
            return static["out"]

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        by_hand = _decode(model, graphed)
        end.record()
        torch.cuda.synchronize()
        compiled_step = torch.compile(lambda m, x, p: m(x, p), mode="reduce-overhead", fullgraph=True)
        compiled = _decode(model, compiled_step)
    return (f"hand graph == eager {by_hand == eager}, reduce-overhead == eager {compiled == eager}, "
            f"elapsed_time >= 0 {start.elapsed_time(end) >= 0} (emulated: True, True, True)")


class _Runner:
    """SGLang's CudaGraphRunner shape: one graph per padded batch size, captured largest first on
    a side stream with `stream=` and one `graph_pool_handle()`, inputs and outputs static."""

    def __init__(self, model, sizes=(1, 2, 4, 8)):
        self.model, self.sizes = model, sizes
        self.ids = torch.zeros(max(sizes), dtype=torch.long, device="cuda")
        self.graphs, self.outputs = {}, {}
        pool, stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
        gc.collect()
        gc.freeze()
        try:
            with torch.cuda.stream(stream):
                for n in reversed(sizes):
                    for _ in range(2):
                        model(self.ids[:n])
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=stream):
                        self.outputs[n] = model(self.ids[:n])
                    self.graphs[n] = graph
        finally:
            gc.unfreeze()

    def __call__(self, ids):
        n = next(size for size in self.sizes if size >= ids.shape[0])
        self.ids.zero_()
        self.ids[:ids.shape[0]].copy_(ids)
        self.graphs[n].replay()
        return self.outputs[n][:ids.shape[0]]


@case
def sglang_style_graph_runner():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 64), nn.SiLU(), nn.Linear(64, 50)).cuda()
    with torch.inference_mode():
        runner = _Runner(model)
        right = []
        for n in (3, 1, 5, 8, 2):
            ids = torch.randint(0, 50, (n,), device="cuda")
            right.append(torch.allclose(runner(ids), model(ids), atol=1e-5))
        torch.accelerator.synchronize()
    return (f"replays right {right}; device module {torch.get_device_module().__name__} (emulated: "
            f"all True; torch.cuda)")


@case
def vllm_style_wrapper_with_weak_outputs():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8)).cuda()
    pool, static_in = torch.cuda.graph_pool_handle(), torch.zeros(16, 8, device="cuda")
    entries = {}

    def weak(t):
        storage = torch._C._construct_storage_from_data_pointer(
            t.untyped_storage().data_ptr(), t.device, t.untyped_storage().nbytes())
        return torch.empty(0, device=t.device, dtype=t.dtype).set_(
            storage, t.storage_offset(), t.shape, t.stride())

    with torch.inference_mode():
        capture = torch.cuda.Stream()
        capture.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(capture):
            for n in (16, 8, 4):
                model(static_in[:n])
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=torch.cuda.current_stream()):
                    entries[n] = (graph, weak(model(static_in[:n])))
        torch.cuda.current_stream().wait_stream(capture)
        right = []
        for _ in range(3):
            torch.compiler.cudagraph_mark_step_begin()
            for n in (4, 16, 8):
                static_in[:n].copy_(torch.randn(n, 8, device="cuda"))
                entries[n][0].replay()
                right.append(torch.allclose(entries[n][1], model(static_in[:n]), atol=1e-5))
    return f"replays right {all(right)} of {len(right)} (emulated: True of 9)"


@case
def tensorrt_llm_style_padded_runner():
    torch.manual_seed(0)
    linear = nn.Linear(8, 8).cuda()
    cache = torch.zeros(64, 8, device="cuda")
    static = {"x": torch.zeros(8, 8, device="cuda"), "lens": torch.zeros(8, dtype=torch.int32, device="cuda"),
              "slots": torch.full((8,), 63, dtype=torch.long, device="cuda")}
    graphs, outputs, pool = {}, {}, None
    main, aux = torch.cuda.Stream(), torch.cuda.Stream()

    def step(x, lens, slots):
        cache.index_copy_(0, slots, x)
        return linear(x) * lens[:, None].float()

    with torch.cuda.stream(main):
        for n in (8, 4, 2, 1):
            args = [v[:n] for v in static.values()]
            step(*args)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=main):
                aux.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(aux):
                    side = args[0].sum(-1)
                out = step(*args)
                torch.cuda.current_stream().wait_stream(aux)
                outputs[n] = out + side[:, None]
            pool, graphs[n] = graph.pool(), graph
    torch.cuda.current_stream().wait_stream(main)
    right = []
    for real in (3, 1, 6, 8):
        n = next(b for b in (1, 2, 4, 8) if b >= real)
        x = torch.randn(real, 8, device="cuda")
        lens = torch.randint(1, 5, (real,), dtype=torch.int32, device="cuda")
        slots = torch.arange(real, device="cuda") + 10
        static["x"][:n].zero_(); static["lens"][:n].fill_(1); static["slots"][:n].fill_(63)
        static["x"][:real].copy_(x); static["lens"][:real].copy_(lens); static["slots"][:real].copy_(slots)
        graphs[n].replay()
        expected = linear(x) * lens[:, None].float() + x.sum(-1)[:, None]
        right.append(torch.allclose(outputs[n][:real], expected, atol=1e-5)
                     and torch.equal(cache[slots], x))
    return f"replays right {right} (emulated: all True)"


@case
def speculative_draft_and_verify_graphs():
    torch.manual_seed(0)
    vocab, k = 40, 3
    draft = nn.Sequential(nn.Embedding(vocab, 8), nn.Linear(8, vocab)).cuda()
    target = nn.Sequential(nn.Embedding(vocab, 16), nn.Linear(16, vocab)).cuda()
    ctx = torch.zeros(4, 8, dtype=torch.long, device="cuda")
    drafted = torch.zeros(4, k, dtype=torch.long, device="cuda")

    def draft_step():
        ids, out = ctx, []
        for _ in range(k):
            nxt = draft(ids)[:, -1].argmax(-1)
            out.append(nxt)
            ids = torch.cat([ids[:, 1:], nxt[:, None]], 1)
        drafted.copy_(torch.stack(out, 1))

    def verify_step():
        pred = target(torch.cat([ctx, drafted], 1))[:, ctx.shape[1] - 1:-1].argmax(-1)
        accepted = torch.cumprod((pred == drafted).int(), 1).sum(1)
        final = torch.where(torch.arange(k, device="cuda")[None] < accepted[:, None], drafted, pred)
        return final, accepted

    pool = torch.cuda.graph_pool_handle()
    with torch.no_grad():
        draft_graph, _ = probe_cases.warmed_capture(draft_step, pool=pool)
        verify_graph, (final, accepted) = probe_cases.warmed_capture(verify_step, pool=pool)
        right = []
        for _ in range(4):
            ctx.copy_(torch.randint(0, vocab, (4, 8), device="cuda"))
            draft_graph.replay()
            verify_graph.replay()
            got = (final.tolist(), accepted.tolist())
            draft_step()
            want = verify_step()
            right.append(got == (want[0].tolist(), want[1].tolist()))
    return f"replays right {right} (emulated: all True)"


@case
def transformers_static_cache_generate():
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as error:
        return f"skipped: {error}"
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).to("cuda").eval()
    ids = torch.tensor([[1, 5, 9, 3]], device="cuda")
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    eager = model.generate(ids, **kwargs).tolist()
    static = model.generate(ids, cache_implementation="static", **kwargs).tolist()
    model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    compiled = [model.generate(ids, cache_implementation="static", **kwargs).tolist() for _ in range(2)]
    return (f"static == eager {static == eager}, compiled twice == eager "
            f"{[c == eager for c in compiled]} (emulated: the CUDA wheels, as the H100 with transformers "
            f"5.17: RuntimeError: Error: accessing tensor output of CUDAGraphs that has been "
            f"overwritten by a subsequent run; the CPU wheel, whose storages cannot raise: True, "
            f"[True, True])")


# --- public bugs ------------------------------------------------------------------------------

@case
def device_tensor_printed_inside_a_capture():
    """SGLang #2460: a collective's logging formatted its tensor arguments inside the capture."""
    x = torch.ones(4, device="cuda")

    def logged():
        y = x * 2
        return f"{(y,)}"

    return (f"{probe_cases.capture_verdict(logged)[:160]} (emulated: op: ['CaptureSyncError: CUDA "
            f"error: operation not permitted when stream is capturing'], end: the capture "
            f"invalidated)")


@case
def compiled_output_read_after_the_next_step():
    """transformers PR #30775 and #48199: a reduce-overhead output kept across the next step."""
    fn = torch.compile(lambda t: t * 2, mode="reduce-overhead")
    x, kept, answers = torch.ones(4, device="cuda"), None, []
    for _ in range(4):
        torch.compiler.cudagraph_mark_step_begin()
        out = fn(x)
        if kept is not None:
            answers.append(_outcome(lambda: kept.sum().item())[:70])
        kept = out
    return (f"{answers} (emulated: torch 2.14.1's CUDA wheel: RuntimeError: Error: accessing tensor "
            f"output of CUDAGraphs that has been overwritten by a subsequent run... for the warm-up's and "
            f"the recording's outputs, ok 8.0 for the first replay's (the device returns a replay's "
            f"outputs as the same tensors each time); the CPU wheel 2.13: ok 8.0 each time, listed: "
            f"no storage can be made to raise there)")


if __name__ == "__main__":
    probe_cases.run(CASES, __file__, sys.argv[1:], answer=probe_cases.whole_answer)
