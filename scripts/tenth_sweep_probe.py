"""CUDA's own answers for the cases of the tenth sweep of public runtimes and bugs (docs/fidelity.md,
"A tenth sweep of public runtimes and bugs"): runtime-shaped programs the nine sweeps before left
out. A sleep-mode-shaped weight and KV-cache split into two `torch.cuda.MemPool`s (vLLM's
CuMemAllocator tags, without its pluggable allocator), a MemPool given to a capture as its pool and
then allocated from; a vLLM V1-style persistent batch (pinned host rows written through numpy
views, rows swapped and condensed, uploaded `non_blocking` into a graph's static inputs); mamba-style
conv and SSM state caches gathered and scattered by a slot index buffer inside a graph; a grammar
bitmask unpacked and applied to the logits inside a graph; a Medusa-style tree verified inside a
graph; `make_graphed_callables` of a module with BatchNorm; raw allocations by
`torch.cuda.caching_allocator_alloc` on a capturing stream (a custom all-reduce's buffers);
streams of a priority (vLLM's and SGLang's high-priority streams).

Plain torch, no harness: run it on a GPU, `python scripts/tenth_sweep_probe.py` (all cases, each
in a process of its own) or with case names. Each case prints one line `case: answer`, with the
emulated device's answer in brackets where it is known to differ or was fixed; compare with
`python scripts/tenth_sweep_probe.py --emulate` on a machine without a GPU."""

from __future__ import annotations

import sys

import probe_cases
import torch
import torch.nn as nn
import torch.nn.functional as F

CASES, case = probe_cases.registry()

_outcome = probe_cases.outcome
_seeded = probe_cases.seeded
MiB = 1 << 20


# --- MemPools: a sleep mode's tags ------------------------------------------------------------

@case
def mem_pools_of_weights_and_kv_cache():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base_reserved = torch.cuda.memory_reserved()
    weights_pool, kv_pool = torch.cuda.MemPool(), torch.cuda.MemPool()
    counts = [weights_pool.use_count()]
    with torch.cuda.use_mem_pool(weights_pool):
        counts.append(weights_pool.use_count())
        weights = [torch.full((3 * MiB // 4,), 1.0, device="cuda") for _ in range(2)]  # 3 MiB each
    with torch.cuda.use_mem_pool(kv_pool):
        kv = torch.zeros(12 * MiB // 4, device="cuda")  # 12 MiB
    counts.append(weights_pool.use_count())
    segments = {
        "weights": sorted(s["total_size"] // MiB for s in weights_pool.snapshot()),
        "kv": sorted(s["total_size"] // MiB for s in kv_pool.snapshot()),
    }
    grown = (torch.cuda.memory_reserved() - base_reserved) // MiB
    backup = [w.to("cpu", non_blocking=False) for w in weights]  # the sleep's host copy
    del weights
    torch.cuda.empty_cache()
    after_free = (torch.cuda.memory_reserved() - base_reserved) // MiB
    del weights_pool
    torch.cuda.empty_cache()
    after_pool = (torch.cuda.memory_reserved() - base_reserved) // MiB
    new_pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(new_pool):
        woken = [b.to("cuda") for b in backup]
    return (f"use counts {counts}; segments (MiB) {segments}; reserved +{grown} MiB, after the "
            f"weights' frees +{after_free}, after the pool's release +{after_pool}; woken sum "
            f"{sum(float(w.sum()) for w in woken)}, kv {float(kv.sum())}")


@case
def mem_pool_given_to_a_capture_then_allocated_from():
    pool = torch.cuda.MemPool()
    x = torch.ones(MiB // 4, device="cuda")
    out = torch.empty_like(x)

    def step():
        scratch = x * 3  # freed inside the capture: its block stays in the pool
        out.copy_(scratch + 1)

    graph, _ = probe_cases.warmed_capture(step, pool=pool.id)
    segments_before = sorted(s["total_size"] for s in pool.snapshot())
    with torch.cuda.use_mem_pool(pool):
        late = torch.zeros(MiB // 4, device="cuda")
    segments_after = sorted(s["total_size"] for s in pool.snapshot())
    graph.replay()
    torch.cuda.synchronize()
    return (f"out {float(out[0])}; a tensor allocated from the pool after the capture (on the "
            f"current stream, not the capture's) reads {float(late[0])} after a replay; use count "
            f"{pool.use_count()}; the pool's segments (bytes) {segments_before} then "
            f"{segments_after}")


# --- a vLLM V1-style persistent batch ---------------------------------------------------------

@case
def persistent_batch_uploaded_from_pinned_rows():
    max_reqs, vocab, hidden = 8, 32, 16
    ids_cpu = torch.zeros(max_reqs, dtype=torch.int64, pin_memory=True)
    temps_cpu = torch.ones(max_reqs, dtype=torch.float32, pin_memory=True)
    ids_np, temps_np = ids_cpu.numpy(), temps_cpu.numpy()
    ids_gpu = torch.zeros(max_reqs, dtype=torch.int64, device="cuda")
    temps_gpu = torch.ones(max_reqs, device="cuda")
    embed = _seeded(vocab, hidden)
    head = _seeded(hidden, vocab, seed=1)
    logits_out = torch.empty(max_reqs, vocab, device="cuda")

    def forward():
        logits_out.copy_((embed[ids_gpu] @ head) / temps_gpu[:, None])

    graph, _ = probe_cases.warmed_capture(forward)
    requests = {"a": (3, 0.5), "b": (7, 1.0), "c": (11, 2.0), "d": (5, 0.7)}
    rows = list(requests)
    agree = []
    for step in range(3):
        if step == 1:  # request "b" finished: condense, the last row moves into its slot
            rows[1], rows[-1] = rows[-1], rows[1]
            rows.pop()
        if step == 2:  # swap two rows, as the batch's reordering does
            rows[0], rows[1] = rows[1], rows[0]
        for i, name in enumerate(rows):
            ids_np[i], temps_np[i] = requests[name][0] + step, requests[name][1]
        n = len(rows)
        ids_gpu[:n].copy_(ids_cpu[:n], non_blocking=True)
        temps_gpu[:n].copy_(temps_cpu[:n], non_blocking=True)
        graph.replay()
        eager = (embed[ids_gpu] @ head) / temps_gpu[:, None]
        agree.append(bool(torch.allclose(logits_out[:n], eager[:n])))
        argmax = logits_out[:n].argmax(-1).tolist()
    return f"replays equal eager {agree}; last argmax {argmax}"


# --- mamba-style state caches -----------------------------------------------------------------

@case
def mamba_state_cache_gathered_and_scattered_in_a_graph():
    slots, batch, dim, width, state = 6, 4, 8, 4, 5
    conv_state = torch.zeros(slots, dim, width, device="cuda")
    ssm_state = torch.zeros(slots, dim, state, device="cuda")
    slot_ids = torch.zeros(batch, dtype=torch.int64, device="cuda")
    x_in = torch.zeros(batch, dim, device="cuda")
    y_out = torch.zeros(batch, dim, device="cuda")
    conv_w = _seeded(dim, width)
    A, B = -torch.rand(dim, state, generator=torch.Generator().manual_seed(2)).to("cuda"), _seeded(dim, state, seed=3)

    def step(conv_state, ssm_state, slot_ids, x_in, y_out):
        conv = conv_state[slot_ids]
        conv = torch.cat([conv[:, :, 1:], x_in[:, :, None]], dim=-1)
        conv_state.index_copy_(0, slot_ids, conv)
        h = (conv * conv_w).sum(-1)
        s = ssm_state[slot_ids] * torch.exp(A) + h[:, :, None] * B
        ssm_state[slot_ids] = s
        y_out.copy_(s.sum(-1) + F.silu(h))

    graph_state = (conv_state, ssm_state, slot_ids, x_in, y_out)
    graph, _ = probe_cases.warmed_capture(lambda: step(*graph_state))
    conv_state.zero_()
    ssm_state.zero_()
    eager_state = tuple(t.clone() for t in graph_state)
    pad = slots - 1  # the padding rows' own slot
    schedule = [[0, 1, 2, pad], [2, 0, 3, pad], [1, 3, 4, 0]]
    agree = []
    for step_no, ids in enumerate(schedule):
        xs = _seeded(batch, dim, seed=10 + step_no)
        for state_set in (graph_state, eager_state):
            state_set[2].copy_(torch.tensor(ids))
            state_set[3].copy_(xs)
        graph.replay()
        step(*eager_state)
        agree.append(all(bool(torch.allclose(a, b)) for a, b in zip(graph_state, eager_state)))
    return f"replays equal eager (outputs and both caches) {agree}"


# --- a grammar bitmask inside a graph ---------------------------------------------------------

@case
def grammar_bitmask_applied_in_a_graph():
    batch, vocab = 3, 80
    words = (vocab + 31) // 32
    logits_in = torch.zeros(batch, vocab, device="cuda")
    bitmask_gpu = torch.zeros(batch, words, dtype=torch.int32, device="cuda")
    bitmask_cpu = torch.zeros(batch, words, dtype=torch.int32, pin_memory=True)
    token_out = torch.zeros(batch, dtype=torch.int64, device="cuda")
    shifts = torch.arange(32, dtype=torch.int32, device="cuda")

    def apply(logits_in, bitmask_gpu, token_out):
        bits = (bitmask_gpu[:, :, None] >> shifts) & 1
        allowed = bits.reshape(batch, -1)[:, :vocab].bool()
        token_out.copy_(logits_in.masked_fill(~allowed, float("-inf")).argmax(-1))

    graph, _ = probe_cases.warmed_capture(lambda: apply(logits_in, bitmask_gpu, token_out))
    agree, tokens = [], []
    for step in range(3):
        allowed = torch.zeros(batch, words * 32, dtype=torch.bool)
        for row in range(batch):
            allowed[row, torch.arange(row + step, vocab, 7)] = True
        packed = (allowed.reshape(batch, words, 32).to(torch.int64) << torch.arange(32)).sum(-1)
        bitmask_cpu.copy_(packed.to(torch.int32))  # bit 31 set wraps to a negative int32
        logits = _seeded(batch, vocab, seed=20 + step)
        logits_in.copy_(logits)
        bitmask_gpu.copy_(bitmask_cpu, non_blocking=True)
        graph.replay()
        eager = torch.zeros_like(token_out)
        apply(logits, bitmask_gpu, eager)
        agree.append(bool(torch.equal(eager, token_out)))
        tokens.append(token_out.tolist())
    return f"replays equal eager {agree}; tokens {tokens}"


# --- a Medusa-style tree verified inside a graph ----------------------------------------------

@case
def medusa_tree_verified_in_a_graph():
    vocab, heads, top = 40, 2, 3
    tree = [[0], [1], [2], [0, 0], [0, 1], [1, 0]]  # paths into (head, top-k choice)
    depth = max(len(p) for p in tree) + 1
    leaves = torch.tensor([p + [-1] * (depth - 1 - len(p)) for p in tree], device="cuda")
    medusa_logits = torch.zeros(heads, vocab, device="cuda")
    target_logits = torch.zeros(len(tree), depth, vocab, device="cuda")
    base_token = torch.zeros((), dtype=torch.int64, device="cuda")
    accept_out = torch.zeros((), dtype=torch.int64, device="cuda")
    best_out = torch.zeros((), dtype=torch.int64, device="cuda")

    def verify(medusa_logits, target_logits, base_token, accept_out, best_out):
        choices = medusa_logits.topk(top, dim=-1).indices  # (heads, top)
        head_ids = torch.arange(depth - 1, device=leaves.device).expand_as(leaves)
        cand = choices[head_ids, leaves.clamp(min=0)]
        cand = torch.where(leaves >= 0, cand, -1)
        cand = torch.cat([base_token.expand(len(tree), 1), cand], dim=1)
        predicted = target_logits.argmax(-1)  # (paths, depth)
        matches = (predicted[:, :-1] == cand[:, 1:]) & (cand[:, 1:] >= 0)
        accepted = matches.int().cumprod(dim=1).sum(dim=1)
        best_out.copy_(accepted.argmax())
        accept_out.copy_(accepted.max())

    bufs = (medusa_logits, target_logits, base_token, accept_out, best_out)
    graph, _ = probe_cases.warmed_capture(lambda: verify(*bufs))
    results = []
    for step in range(3):
        m = _seeded(heads, vocab, seed=30 + step)
        t = _seeded(len(tree), depth, vocab, seed=40 + step)
        best_choice = m.topk(top, dim=-1).indices
        t[3, 0, best_choice[0, 0]] += 100.0  # path [0, 0] accepted
        t[3, 1, best_choice[1, 0]] += 100.0 * (step % 2)
        medusa_logits.copy_(m)
        target_logits.copy_(t)
        base_token.fill_(step)
        graph.replay()
        eager = tuple(torch.zeros((), dtype=torch.int64, device="cuda") for _ in range(2))
        verify(m, t, base_token, *eager)
        results.append((accept_out.item(), best_out.item(), eager[0].item(), eager[1].item()))
    return f"(accepted, best path) replayed then eager per step {results}"


# --- make_graphed_callables of a module with BatchNorm ----------------------------------------

@case
def graphed_module_with_batch_norm():
    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6), nn.ReLU()).to("cuda")

    eager, graphed_module = build(), build()
    sample = torch.randn(5, 6, device="cuda", requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(graphed_module, (sample,))
    for _ in range(3):  # make_graphed_callables' three warmups, without accumulating grads
        torch.autograd.grad(eager(sample).sum(), tuple(eager.parameters()))
    grads_equal = []
    for i in range(2):
        x = _seeded(5, 6, seed=50 + i)
        for module in (eager, graphed_module):
            module.zero_grad(set_to_none=True)
        eager(x).sum().backward()
        graphed(x.clone().requires_grad_()).sum().backward()
        grads_equal.append(bool(torch.allclose(eager[0].weight.grad, graphed_module[0].weight.grad,
                                               atol=1e-6)))
    bn_e, bn_g = eager[1], graphed_module[1]
    return (f"num_batches_tracked eager {int(bn_e.num_batches_tracked)} graphed "
            f"{int(bn_g.num_batches_tracked)}; running mean and var equal "
            f"{bool(torch.allclose(bn_e.running_mean, bn_g.running_mean))}, "
            f"{bool(torch.allclose(bn_e.running_var, bn_g.running_var))}; weight grads equal "
            f"per step {grads_equal}")


# --- an RNN under autocast (a transducer's prediction network, graphed) ------------------------

@case
def rnns_under_autocast_and_in_a_graph():
    answers = {}
    for cls in (nn.LSTM, nn.GRU, nn.RNN):
        for dtype in (torch.float16, torch.bfloat16):
            torch.manual_seed(0)
            rnn = cls(5, 6, num_layers=2).to("cuda")
            with torch.autocast("cuda", dtype=dtype):
                out, _ = rnn(torch.randn(3, 4, 5, device="cuda"))
            answers[f"{cls.__name__} {str(dtype)[6:]}"] = str(out.dtype)[6:]
    torch.manual_seed(0)
    lstm = nn.LSTM(5, 6).to("cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        answers["LSTM of a bfloat16 input"] = _outcome(
            lambda: str(lstm(torch.randn(3, 4, 5, device="cuda", dtype=torch.bfloat16))[0].dtype))
        with torch.backends.cudnn.flags(enabled=False):
            answers["LSTM bfloat16, cuDNN off"] = _outcome(
                lambda: str(lstm(torch.randn(3, 4, 5, device="cuda"))[0].dtype))
    torch.manual_seed(0)
    lstm = nn.LSTM(5, 6, num_layers=2).to("cuda")
    token = torch.randn(1, 4, 5, device="cuda")
    state = tuple(torch.zeros(2, 4, 6, device="cuda") for _ in range(2))
    out = torch.zeros(1, 4, 6, dtype=torch.float16, device="cuda")

    def step():
        with torch.autocast("cuda", cache_enabled=False):
            y, _ = lstm(token, state)
        out.copy_(y)

    graph, _ = probe_cases.warmed_capture(step)
    token.copy_(_seeded(1, 4, 5, seed=60))
    graph.replay()
    with torch.autocast("cuda"):
        eager, _ = lstm(token, state)
    return (f"output dtypes {answers}; the graphed step equals eager "
            f"{bool(torch.allclose(out.float(), eager.float()))} (emulated now: float16 on cuDNN's "
            f"path, bfloat16 inputs too; the autocast dtype with cuDNN off; before this sweep "
            f"float32 everywhere, the CPU's RNN kernels uncast)")


@case
def composites_under_autocast():
    x = torch.randn(4, 8, device="cuda").half()
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(8, 2).to("cuda")
    q = torch.randn(3, 2, 8, device="cuda")
    calls = {
        "square": lambda: torch.square(x), "Tensor.norm": lambda: x.norm(),
        "linalg.norm": lambda: torch.linalg.norm(x), "normalize": lambda: F.normalize(x),
        "softmin": lambda: F.softmin(x, -1), "special.log1p": lambda: torch.special.log1p(x.abs()),
        "special.softmax": lambda: torch.special.softmax(x, -1),
        "local_response_norm": lambda: F.local_response_norm(x[None], 2),
        "MultiheadAttention (out, weights)": lambda: tuple(str(t.dtype)[6:] for t in attention(q, q, q)),
        "pairwise_distance": lambda: F.pairwise_distance(x, x),
        "gaussian_nll_loss": lambda: F.gaussian_nll_loss(x, x, x.abs() + 1),
        "rms_norm": lambda: F.rms_norm(x, (8,)),
        "affine_grid": lambda: F.affine_grid(torch.randn(2, 2, 3, device="cuda"), (2, 1, 4, 4),
                                             align_corners=False),
        "BCELoss": lambda: nn.BCELoss()(torch.sigmoid(x.float()), torch.rand(4, 8, device="cuda")),
    }
    answers = {}
    out = torch.zeros(3, 2, 8, dtype=torch.float16, device="cuda")

    def step():
        with torch.no_grad(), torch.autocast("cuda", cache_enabled=False):
            out.copy_(attention(q, q, q, need_weights=False)[0])

    graph, _ = probe_cases.warmed_capture(step)
    q.copy_(_seeded(3, 2, 8, seed=70))
    graph.replay()
    with torch.no_grad(), torch.autocast("cuda"):
        answers["MHA captured, replay equals eager"] = bool(torch.allclose(
            out.float(), attention(q, q, q, need_weights=False)[0].float(), atol=2e-3))
    with torch.autocast("cuda"):
        for name, call in calls.items():
            answers[name] = _outcome(lambda: (lambda r: r if isinstance(r, tuple) else str(r.dtype)[6:])(call()))[:90]
    return (f"{answers} (emulated now: float32 for the first eight and gaussian_nll_loss, MHA "
            f"('float16', 'float32'), BCELoss refused as 'unsafe to autocast'; pairwise_distance "
            f"float32, rms_norm and affine_grid float16, as the H100 gave them; before this sweep "
            f"float16 for all but MHA's ('float32', 'float32'), BCELoss computed)")


# --- raw allocations on a capturing stream ----------------------------------------------------

@case
def raw_allocation_on_a_capturing_stream():
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    x = torch.ones(4, device="cuda")
    before = torch.cuda.memory_stats().get("allocation.all.current", 0)
    answers = {}
    with torch.cuda.stream(side):
        with torch.cuda.graph(graph, stream=side):
            y = x * 2
            answers["alloc in capture"] = _outcome(
                lambda: torch.cuda.caching_allocator_alloc(MiB, stream=side))
    ptr_text = answers["alloc in capture"]
    if ptr_text.startswith("ok "):
        ptr = int(ptr_text[3:])
        in_graph_pool = [s["allocated_size"] for s in torch.cuda.memory_snapshot()
                         if tuple(s.get("segment_pool_id", (0, 0))) == tuple(graph.pool())]
        answers["graph pool's allocated bytes"] = sum(in_graph_pool)
        answers["delete"] = _outcome(lambda: torch.cuda.caching_allocator_delete(ptr))
    graph.replay()
    answers["y"] = y.tolist()
    answers["allocations grew"] = torch.cuda.memory_stats().get("allocation.all.current", 0) - before
    return str(answers)


# --- streams of a priority ---------------------------------------------------------------------

@case
def streams_of_a_priority():
    least, greatest = torch.cuda.Stream.priority_range()
    made = {p: torch.cuda.Stream(priority=p).priority for p in (0, -1, -2, -5, -10, 3)}
    high = torch.cuda.Stream(priority=greatest)
    x = torch.ones(4, device="cuda")
    high.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(high):
        y = x * 3
    torch.cuda.current_stream().wait_stream(high)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=high):
        z = y + 1
    graph.replay()
    return f"range ({least}, {greatest}); priorities made {made}; replay {z.tolist()}"


if __name__ == "__main__":
    probe_cases.run(CASES, __file__, sys.argv[1:], answer=probe_cases.whole_answer)
