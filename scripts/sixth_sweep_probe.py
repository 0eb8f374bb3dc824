"""CUDA's own answers for the cases of the sixth sweep of public runtimes and bugs (docs/fidelity.md,
"A sixth sweep of public runtimes and bugs"): MoE routing, logits processors, LoRA index buffers,
speculative decoding's draft graphs, padded dummy requests, piecewise capture, graphed callables
under autocast with a GradScaler, grouped GEMM and flex attention, and the ops whose CUDA kernels
read on the host where the CPU's do not (`isin`'s sorting path, `masked_fill` of a device value,
`one_hot`) or that CUDA has no kernel for (`histogram`).

Plain torch, no harness: run it on a GPU, `python scripts/sixth_sweep_probe.py` (all cases, each in
a process of its own, since a refused capture can leave CUDA's context unusable) or with case names.
Each case prints one line `case: answer`, with the emulated device's answer in brackets; compare
with `python scripts/sixth_sweep_probe.py --emulate` on a machine without a GPU. "(unknown)" marks
the cases whose CUDA answer the emulated device's may not match."""

from __future__ import annotations

import sys

import probe_cases
import torch
import torch.nn.functional as F

CASES, case = probe_cases.registry()

_outcome = probe_cases.outcome
_warmed_capture = probe_cases.warmed_capture
_capture_verdict = probe_cases.capture_verdict
_flags_a_sync = probe_cases.flags_a_sync
_seeded = probe_cases.seeded


# --- ops whose CUDA kernel reads on the host, or that CUDA lacks ------------------------------

@case
def isin_in_capture():
    """PyTorch #130078; TensorCompare.cpp: numpy's heuristic picks the sort, `_unique` syncs."""
    vocab = torch.arange(4096, device="cuda")
    few, many = torch.arange(0, 300, 10, device="cuda"), torch.arange(0, 640, 10, device="cuda")
    return (f"30 tests: {_capture_verdict(lambda: torch.isin(vocab, few))}; 64 tests: "
            f"{_capture_verdict(lambda: torch.isin(vocab, many))}; 64 assume_unique: "
            f"{_capture_verdict(lambda: torch.isin(vocab, many, assume_unique=True))}; sync flagged "
            f"(30, 64): {_flags_a_sync(lambda: torch.isin(vocab, few))}, "
            f"{_flags_a_sync(lambda: torch.isin(vocab, many))} (decided from source; emulated: "
            f"captured; refused as a sync, invalidated; Copy.cu's pageable-copy refusal, the "
            f"capture still valid; False, True)")


@case
def masked_fill_of_a_device_value_in_capture():
    """PyTorch PR #190512 (open): masked_fill__cuda(self, mask, Tensor value) calls value.item()."""
    x = _seeded(8, 8)
    device_value, host_value = torch.tensor(-1.0, device="cuda"), torch.tensor(-1.0)
    return (f"device value: {_capture_verdict(lambda: x.masked_fill(x > 0, device_value))}; "
            f"host value: {_capture_verdict(lambda: x.masked_fill(x > 0, host_value))}; "
            f"torch.where: {_capture_verdict(lambda: torch.where(x > 0, device_value, x))}; sync "
            f"flagged (device, host): {_flags_a_sync(lambda: x.masked_fill(x > 0, device_value))}, "
            f"{_flags_a_sync(lambda: x.masked_fill(x > 0, host_value))} (decided from source; "
            f"emulated: refused as a sync, invalidated; captured; captured; True, False)")


def _one_hot_of(value: int) -> str:
    out = _outcome(lambda: F.one_hot(torch.tensor([value, 1], device="cuda"), 4).sum().item())
    return out.split("\n")[0][:60]


@case
def one_hot_of_device_ids():
    """Onehot.cpp: CUDA checks num_classes >= 1 only, scatter asserts on a bad class value."""
    ids = torch.tensor([0, 3], device="cuda")
    return (f"sync flagged with num_classes: {_flags_a_sync(lambda: F.one_hot(ids, 4))}, "
            f"without: {_flags_a_sync(lambda: F.one_hot(ids))}; in a capture: "
            f"{_capture_verdict(lambda: F.one_hot(ids, 4))}; num_classes=0: "
            f"{_outcome(lambda: F.one_hot(ids, 0))[:50]} (decided from source; emulated: False, "
            f"False (CUDA: True, a max().item() inside not flagged here); captured; RuntimeError: "
            f"num_classes should be positive)")


@case
def one_hot_of_a_padding_id():
    return (f"{_one_hot_of(-1)} (decided from source: scatter's device-side assert; emulated: "
            f"DeviceAssertError, an AcceleratorError: CUDA error: device-side assert triggered)")


@case
def histogram_of_device_tensors():
    x = _seeded(100)
    return (f"histogram: {_outcome(lambda: torch.histogram(x, bins=4))[:90]}; histogramdd: "
            f"{_outcome(lambda: torch.histogramdd(x.view(50, 2), bins=[2, 2]))[:90]} (decided from "
            f"the CUDA wheels' dispatch tables; emulated: NotImplementedError: Could not run "
            f"'aten::histogram.bin_ct' / 'aten::_histogramdd_bin_edges' with arguments from the "
            f"'CUDA' backend)")


@case
def nonzero_static_and_masked_select_in_capture():
    x = _seeded(64)
    return (f"nonzero_static: {_capture_verdict(lambda: torch.nonzero_static(x > 0, size=64))}; "
            f"masked_select: {_capture_verdict(lambda: torch.masked_select(x, x > 0))} "
            f"(emulated: captured; refused as a sync, invalidated)")


# --- MoE routing ------------------------------------------------------------------------------

def _router(logits: torch.Tensor, experts: int, top_k: int):
    weights, chosen = torch.topk(logits.softmax(-1), top_k, dim=-1)
    flat = chosen.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(experts, dtype=torch.long, device=logits.device).scatter_add_(
        0, flat, torch.ones_like(flat))
    offsets = torch.cumsum(counts, 0)
    histc_counts = torch.histc(flat.float(), bins=experts, min=0, max=experts - 1)
    mask = F.one_hot(chosen, experts).sum(1)
    return weights / weights.sum(-1, keepdim=True), order, offsets, histc_counts, mask


@case
def moe_routing_in_capture():
    logits = _seeded(16, 8)
    graph, outs = _warmed_capture(lambda: _router(logits, 8, 2))
    new = _seeded(16, 8, seed=1)
    logits.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    same = all(torch.equal(a, b) if a.dtype != torch.float32 else torch.allclose(a, b, atol=1e-6)
               for a, b in zip(outs, _router(new, 8, 2)))
    chosen = torch.topk(logits, 2, -1).indices.flatten()
    return (f"topk/argsort/scatter_add_/cumsum/histc/one_hot replay equals eager: {same}; bincount: "
            f"{_capture_verdict(lambda: torch.bincount(chosen, minlength=8))} (emulated: True; "
            f"Copy.cu's pageable-copy refusal, the capture still valid)")


@case
def grouped_mm_in_capture():
    if not hasattr(torch, "_grouped_mm"):
        return "no torch._grouped_mm in this build (emulated: the same)"
    a = _seeded(16, 32).to(torch.bfloat16)
    b = _seeded(4, 32, 8, seed=1).to(torch.bfloat16)
    offs = torch.tensor([4, 8, 12, 16], device="cuda", dtype=torch.int32)
    bf16 = _capture_verdict(lambda: torch._grouped_mm(a, b, offs=offs))
    fp32 = _capture_verdict(lambda: torch._grouped_mm(a.float(), b.float(), offs=offs))
    return (f"bf16: {bf16}; float32: {fp32} (decided from GroupedMMUtils.h: the float32 "
            f"fallback's `offs.cpu()`; emulated: captured; Copy.cu's pageable-copy refusal, the "
            f"capture still valid)")


# --- logits processors, LoRA, speculative decoding, padding --------------------------------------

def _process(logits, previous, penalty, temperature, top_p, banned):
    scores = logits.gather(1, previous)
    scores = torch.where(scores < 0, scores * penalty, scores / penalty)
    logits = logits.scatter(1, previous, scores) / temperature
    logits = logits.masked_fill(banned, float("-inf"))
    sorted_logits, order = logits.sort(-1, descending=True)
    probs = sorted_logits.softmax(-1)
    drop = probs.cumsum(-1) - probs > top_p
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return logits.scatter(1, order, sorted_logits).argmax(-1)


@case
def logits_processors_in_capture():
    logits, previous = _seeded(4, 64), torch.randint(0, 64, (4, 5), device="cuda")
    penalty = torch.full((4, 1), 1.3, device="cuda")
    temperature, top_p = torch.full((4, 1), 0.7, device="cuda"), torch.full((4, 1), 0.9, device="cuda")
    banned = torch.zeros(4, 64, dtype=torch.bool, device="cuda")
    banned[:, :4] = True
    graph, tokens = _warmed_capture(
        lambda: _process(logits, previous, penalty, temperature, top_p, banned))
    right = []
    for seed in (1, 2):
        logits.copy_(_seeded(4, 64, seed=seed))
        temperature.fill_(0.5 + seed / 10)
        graph.replay()
        right.append(tokens.tolist() == _process(logits, previous, penalty, temperature, top_p,
                                                 banned).tolist())
    return f"each replay equals eager: {right} (emulated: [True, True])"


@case
def lora_index_buffers_with_an_adapter_swapped_in():
    """Punica-style: stacked adapter weights per slot, a per-token slot index in a static buffer,
    an adapter loaded into a slot after capture by copy_."""
    slots, rank, dim = 3, 4, 16
    lora_a = torch.zeros(slots, dim, rank, device="cuda")
    lora_b = torch.zeros(slots, rank, dim, device="cuda")
    base = _seeded(dim, dim)
    x, token_slots = _seeded(6, dim, seed=1), torch.zeros(6, dtype=torch.long, device="cuda")

    def forward():
        delta = torch.bmm(torch.bmm(x.unsqueeze(1), lora_a[token_slots]), lora_b[token_slots])
        return x @ base + delta.squeeze(1)

    graph, out = _warmed_capture(forward)
    lora_a[2].copy_(_seeded(dim, rank, seed=2))
    lora_b[2].copy_(_seeded(rank, dim, seed=3))
    token_slots.copy_(torch.tensor([0, 2, 2, 1, 0, 2]))
    graph.replay()
    torch.cuda.synchronize()
    return (f"replay with the swapped adapter equals eager: "
            f"{torch.allclose(out, forward(), atol=1e-5)} (emulated: True)")


def _eagle_replays(target_first: bool) -> list[bool]:
    """A target graph and a draft graph of K steps in one pool, the tree's attention mask a static
    buffer refilled before each step; each step replays the draft, then the target, then reads
    both outputs (the draft's proposals checked against the target's verification)."""
    dim, vocab, k = 16, 32, 3
    embed, head = _seeded(vocab, dim), _seeded(dim, vocab, seed=1)
    draft_w = _seeded(dim, dim, seed=2) / 4
    tokens = torch.zeros(4, dtype=torch.long, device="cuda")
    tree_mask = torch.ones(4, 4, device="cuda").tril()

    def target():
        h = embed[tokens]
        attn = (h @ h.T).masked_fill(tree_mask == 0, float("-inf")).softmax(-1)
        return (attn @ h @ head).argmax(-1)

    def draft():
        h, out = embed[tokens[-1:]], []
        for _ in range(k):
            h = torch.tanh(h @ draft_w)
            out.append((h @ head).argmax(-1))
        return torch.cat(out)

    pool = torch.cuda.graph_pool_handle()
    if target_first:
        target_graph, verified = _warmed_capture(target, pool=pool)
        draft_graph, proposed = _warmed_capture(draft, pool=pool)
    else:
        draft_graph, proposed = _warmed_capture(draft, pool=pool)
        target_graph, verified = _warmed_capture(target, pool=pool)
    right = []
    for seed in (1, 2):
        tokens.copy_(torch.randint(0, vocab, (4,), generator=torch.Generator().manual_seed(seed)))
        tree_mask.copy_(torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1.0]]))
        draft_graph.replay()
        target_graph.replay()
        right.append(proposed.tolist() == draft().tolist() and verified.tolist() == target().tolist())
    return right


@case
def eagle_draft_and_target_graphs_in_one_pool():
    """Graphs sharing a pool keep each other's values only when replayed in capture order: the
    target captured first and replayed second writes its intermediates over the draft's live
    proposals (SGLang #22930's shared pool, in another form)."""
    return (f"captured in replay order: {_eagle_replays(target_first=False)}; target captured "
            f"first: {_eagle_replays(target_first=True)} (emulated: [True, True]; [False, False], "
            f"silently on both)")


@case
def padded_dummy_requests_and_metadata_buffers():
    """TensorRT-LLM-style: a batch of 3 padded to the captured 4 with a dummy request (sequence
    length 1, the reserved block 0), metadata buffers copied into before the replay."""
    max_batch, blocks, block_size, dim = 4, 8, 4, 8
    cache = _seeded(blocks * block_size, dim)
    seq_lens = torch.ones(max_batch, dtype=torch.long, device="cuda")
    block_table = torch.zeros(max_batch, 2, dtype=torch.long, device="cuda")
    query = torch.zeros(max_batch, dim, device="cuda")

    def attend():
        positions = torch.arange(2 * block_size, device="cuda")
        slots = (block_table.repeat_interleave(block_size, 1) * block_size
                 + positions % block_size)
        keys = cache[slots]
        scores = (keys @ query.unsqueeze(-1)).squeeze(-1)
        scores = scores.masked_fill(positions >= seq_lens.unsqueeze(1), float("-inf"))
        return (scores.softmax(-1).unsqueeze(-1) * keys).sum(1)

    graph, out = _warmed_capture(attend)
    real_lens, real_tables = torch.tensor([5, 3, 8]), torch.tensor([[1, 2], [3, 0], [4, 5]])
    seq_lens[:3].copy_(real_lens)
    seq_lens[3:].fill_(1)
    block_table[:3].copy_(real_tables)
    block_table[3:].fill_(0)
    query.copy_(_seeded(max_batch, dim, seed=4))
    graph.replay()
    torch.cuda.synchronize()
    eager = attend()
    return (f"real rows equal eager: {torch.allclose(out[:3], eager[:3], atol=1e-5)}, dummy row "
            f"finite: {bool(out[3].isfinite().all())} (emulated: True, True)")


@case
def piecewise_graphs_around_eager_attention():
    """SGLang/vLLM piecewise capture: the layers' dense parts captured as graphs in one pool, the
    attention between them run eagerly at each step."""
    dim = 16
    w1, w2 = _seeded(dim, dim), _seeded(dim, dim, seed=1)
    x = torch.zeros(4, dim, device="cuda")
    pool = torch.cuda.graph_pool_handle()
    first_graph, hidden = _warmed_capture(lambda: torch.relu(x @ w1), pool=pool)
    attended = torch.zeros(4, dim, device="cuda")
    second_graph, out = _warmed_capture(lambda: attended @ w2, pool=pool)

    def eager(inp):
        h = torch.relu(inp @ w1)
        return (h @ h.T).softmax(-1) @ h @ w2

    right = []
    for seed in (1, 2):
        new = _seeded(4, dim, seed=seed)
        x.copy_(new)
        first_graph.replay()
        attended.copy_((hidden @ hidden.T).softmax(-1) @ hidden)
        second_graph.replay()
        right.append(torch.allclose(out, eager(new), atol=1e-4))
    return f"each piecewise step equals eager: {right} (emulated: [True, True])"


@case
def compiled_piece_captured_by_the_runner():
    """SGLang's piecewise runner with torch.compile: a compiled piece warmed up, then captured by
    the runner's own `torch.cuda.graph` (CUDA runs inductor's kernels inside the capture; the
    emulated device runs the frame as eager code there, a listed difference)."""
    w = _seeded(16, 16)
    piece = torch.compile(lambda x: torch.relu(x @ w) * 2 + 1)
    x = torch.zeros(4, 16, device="cuda")
    graph, out = _warmed_capture(lambda: piece(x))
    new = _seeded(4, 16, seed=3)
    x.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    return (f"replay equals eager: {torch.allclose(out, torch.relu(new @ w) * 2 + 1, atol=1e-5)} "
            f"(emulated: True)")


@case
def flashinfer_style_metadata_staged_through_pinned_memory():
    """vLLM's FlashInfer builder for a FULL graph: persistent paged-KV buffers (indptr, indices,
    last page lengths) sized for the captured batch, each step's plan built on the host into one
    pinned staging tensor and copied in with non_blocking=True before the replay."""
    pages, page, dim, batch = 8, 4, 8, 2
    cache = _seeded(pages * page, dim)
    indptr = torch.zeros(batch + 1, dtype=torch.long, device="cuda")
    indices = torch.zeros(pages, dtype=torch.long, device="cuda")
    last_len = torch.ones(batch, dtype=torch.long, device="cuda")
    staging = torch.zeros(batch + 1 + pages + batch, dtype=torch.long, pin_memory=True)
    query = torch.zeros(batch, dim, device="cuda")

    def attend():
        slot = torch.arange(pages * page, device="cuda")
        owner = torch.searchsorted(indptr[1:] * page, slot, right=True).clamp(max=batch - 1)
        length = (indptr[1:] - indptr[:-1] - 1) * page + last_len
        position = slot - indptr[owner] * page
        keys = cache[indices.repeat_interleave(page, output_size=pages * page) * page + slot % page]
        scores = (keys * query[owner]).sum(-1).masked_fill(position >= length[owner], float("-inf"))
        weights = torch.zeros(batch, pages * page, device="cuda").scatter_(
            0, owner.unsqueeze(0), scores.exp().unsqueeze(0))
        return (weights / weights.sum(-1, keepdim=True)) @ keys

    graph, out = _warmed_capture(attend)
    right = []
    for step, plan in enumerate(([0, 2, 3], [0, 1, 3])):
        staging[:batch + 1] = torch.tensor(plan)
        staging[batch + 1:batch + 1 + pages] = torch.randperm(
            pages, generator=torch.Generator().manual_seed(step))
        staging[-batch:] = torch.tensor([3, 2])
        indptr.copy_(staging[:batch + 1], non_blocking=True)
        indices.copy_(staging[batch + 1:batch + 1 + pages], non_blocking=True)
        last_len.copy_(staging[-batch:], non_blocking=True)
        query.copy_(_seeded(batch, dim, seed=step + 5))
        graph.replay()
        right.append(torch.allclose(out, attend(), atol=1e-5))
        torch.cuda.synchronize()  # the staging tensor is refilled only after its copies ran
    return f"each replay equals eager: {right} (emulated: [True, True])"


# --- graphed callables under autocast --------------------------------------------------------

@case
def make_graphed_callables_under_autocast_with_a_grad_scaler():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).cuda()
    sample = torch.randn(8, 16, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        cached = _outcome(lambda: torch.cuda.make_graphed_callables(model, (sample,)))
    reference = [p.detach().clone() for p in model.parameters()]
    with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
        graphed = torch.cuda.make_graphed_callables(model, (sample,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 10)
    losses = []
    for step in range(3):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step)).to("cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            loss = graphed(x).float().pow(2).mean()
        optimizer.zero_grad(set_to_none=False)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(round(loss.item(), 4))
    moved = any(not torch.equal(p, r) for p, r in zip(model.parameters(), reference))
    return (f"autocast cache on: {cached[:100]}; cache off: losses {losses}, parameters moved "
            f"{moved}, scale {scaler.get_scale()} (emulated: RuntimeError: make_graphed_callables "
            f"does not support the autocast caching ...; three finite losses, True, 1024.0)")


@case
def flex_attention_eager_with_a_block_mask_in_capture():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    q = _seeded(1, 2, 128, 16)
    mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, 1, 1, 128, 128, device="cuda")
    def causal(b, h, qi, ki):
        return qi >= ki

    attention = _capture_verdict(lambda: flex_attention(q, q, q, block_mask=mask))
    masking = _capture_verdict(lambda: create_block_mask(causal, 1, 1, 128, 128, device="cuda"))
    return (f"flex_attention (eager): {attention}; create_block_mask: {masking} "
            f"(unknown; emulated: both refused by name, a higher-order operator and a torch.func "
            f"transform inside a capture, a listed difference)")


if __name__ == "__main__":
    probe_cases.run(CASES, __file__, sys.argv[1:], answer=probe_cases.whole_answer)
