"""A model runner written only against `torch.cuda` and "cuda" tensors, shaped like nano-vllm's:
host metadata built in pinned memory and copied with `.cuda(non_blocking=True)`, decode graphs for a
batch-size ladder captured largest first into one shared pool (`graph.pool()`), static graph
buffers, padding rows with `slot_mapping.fill_(-1)`, and replay after copying the step's inputs in.
Prefill runs eagerly, one position at a time (the example keeps the model small, not fast)."""

from __future__ import annotations

import torch

from tiny_model import Context, TinyConfig, TinyDecoder


class ModelRunner:
    def __init__(self, config: TinyConfig = TinyConfig(), *, seed: int = 0, max_bs: int = 8,
                 max_num_seqs: int = 16, enforce_eager: bool = False) -> None:
        self.config = config
        torch.set_default_device("cuda")
        try:
            self.model = TinyDecoder(config, seed=seed).cuda().eval()
        finally:
            torch.set_default_device("cpu")
        self.max_bs = max_bs
        self.max_num_seqs = max_num_seqs
        self.enforce_eager = enforce_eager
        self.capture_order: list[int] = []
        self.replays: dict[int, int] = {}
        self.reserve()
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.graph_bs = [bs for bs in (1, 2, 4, 8, 16) if bs <= max_bs]
        self.graph_pool = None
        self.graph_vars: dict[str, torch.Tensor] = {}
        if not enforce_eager:
            self.capture_cudagraph()

    def reserve(self) -> None:
        """Size every buffer for the largest eager batch before any capture (a workspace regrown
        after capture would leave the graphs on the freed one)."""
        self.model.reserve_workspace(self.max_num_seqs)

    # --- metadata, as nano-vllm's prepare_decode builds it -----------------------------------

    def prepare(self, seqs: list[list[int]], positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Device inputs and context for one decode step of `seqs` (each a block-table row)."""
        c = self.config
        slot_mapping, context_lens, block_tables = [], [], []
        for blocks, pos in zip(seqs, positions):
            slot_mapping.append(blocks[pos // c.block_size] * c.block_size + pos % c.block_size)
            context_lens.append(pos + 1)
            block_tables.append(blocks + [0] * (c.max_blocks_per_seq - len(blocks)))

        def to_device(values, dtype):
            return torch.tensor(values, dtype=dtype, pin_memory=True).cuda(non_blocking=True)

        self.model.context = Context(to_device(slot_mapping, torch.int32),
                                     to_device(context_lens, torch.int32),
                                     to_device(block_tables, torch.int32))
        return to_device(positions, torch.int64)

    # --- graphs ------------------------------------------------------------------------------

    @torch.inference_mode()
    def capture_cudagraph(self) -> None:
        c, max_bs = self.config, self.max_bs
        input_ids = torch.zeros(max_bs, dtype=torch.int64, device="cuda")
        positions = torch.zeros(max_bs, dtype=torch.int64, device="cuda")
        slot_mapping = torch.full((max_bs,), -1, dtype=torch.int32, device="cuda")
        context_lens = torch.ones(max_bs, dtype=torch.int32, device="cuda")
        block_tables = torch.zeros(max_bs, c.max_blocks_per_seq, dtype=torch.int32, device="cuda")
        outputs = torch.zeros(max_bs, c.hidden, device="cuda")
        for bs in reversed(self.graph_bs):  # largest first: later graphs reuse its pool memory
            graph = torch.cuda.CUDAGraph()
            self.model.context = Context(slot_mapping[:bs], context_lens[:bs], block_tables[:bs])
            outputs[:bs] = self.model(input_ids[:bs], positions[:bs])  # warmup
            with torch.cuda.graph(graph, self.graph_pool):
                outputs[:bs] = self.model(input_ids[:bs], positions[:bs])  # capture
            if self.graph_pool is None:
                self.graph_pool = graph.pool()
            self.graphs[bs] = graph
            self.capture_order.append(bs)
            torch.cuda.synchronize()
        self.model.context = None
        self.graph_vars = dict(input_ids=input_ids, positions=positions, slot_mapping=slot_mapping,
                               context_lens=context_lens, block_tables=block_tables, outputs=outputs)

    @torch.inference_mode()
    def run_model(self, input_ids: torch.Tensor, positions: torch.Tensor, is_prefill: bool) -> torch.Tensor:
        bs = input_ids.size(0)
        if is_prefill or self.enforce_eager or bs > self.max_bs:
            return self.model.compute_logits(self.model(input_ids, positions))
        context = self.model.context
        size = next(x for x in self.graph_bs if x >= bs)
        graph = self.graphs[size]
        self.replays[size] = self.replays.get(size, 0) + 1
        graph_vars = self.graph_vars
        graph_vars["input_ids"][:bs] = input_ids
        graph_vars["positions"][:bs] = positions
        graph_vars["slot_mapping"].fill_(-1)
        graph_vars["slot_mapping"][:bs] = context.slot_mapping
        graph_vars["context_lens"].fill_(1)
        graph_vars["context_lens"][:bs] = context.context_lens
        graph_vars["block_tables"][:bs, :context.block_tables.size(1)] = context.block_tables
        graph.replay()
        return self.model.compute_logits(graph_vars["outputs"][:bs])

    # --- a greedy loop over it ---------------------------------------------------------------

    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Greedy tokens for each prompt; every sequence owns consecutive blocks."""
        c = self.config
        self.model.k_cache.zero_()
        self.model.v_cache.zero_()
        per_seq = c.max_blocks_per_seq
        seqs = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(len(prompts))]
        tokens = [list(p) for p in prompts]
        out: list[list[int]] = [[] for _ in prompts]
        for pos in range(max(len(p) for p in prompts) + max_new_tokens - 1):
            live = [i for i, t in enumerate(tokens) if pos < len(t) and len(out[i]) < max_new_tokens]
            if not live:
                break
            prefill = any(pos < len(prompts[i]) - 1 for i in live)
            positions = self.prepare([seqs[i] for i in live], [pos] * len(live))
            ids = torch.tensor([tokens[i][pos] for i in live], dtype=torch.int64,
                               pin_memory=True).cuda(non_blocking=True)
            logits = self.run_model(ids, positions, is_prefill=prefill)
            next_ids = logits.argmax(-1).tolist()
            for i, token in zip(live, next_ids):
                if pos >= len(prompts[i]) - 1:
                    out[i].append(token)
                    tokens[i].append(token)
        return out
