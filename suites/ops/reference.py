"""Naive attention in float64, one sequence at a time: the oracle the paged ops are checked against.

It knows nothing of blocks, slots or padding: it takes each sequence's whole K/V history as a
plain tensor and a dense causal softmax over it.
"""

from __future__ import annotations

import torch


def naive_attention(queries: list[torch.Tensor], keys: list[torch.Tensor],
                    values: list[torch.Tensor], scale: float,
                    visible_blocks: list[torch.Tensor] | None = None,
                    block_size: int = 1) -> torch.Tensor:
    """queries[i] [query_len, H, D] are the last tokens of a sequence whose keys[i]/values[i]
    [seq_len, KVH, D] hold the whole history. Returns float64 [sum query_len, H, D].

    visible_blocks[i], when given, is [query_len, H, k] logical block indices: a query then only
    sees positions inside those blocks (block-sparse reference)."""
    rows = []
    for i, (q, k, v) in enumerate(zip(queries, keys, values)):
        q, k, v = q.cpu(), k.cpu(), v.cpu()
        seq_len, query_len = k.shape[0], q.shape[0]
        heads, kv_heads = q.shape[1], k.shape[1]
        for t in range(query_len):
            position = seq_len - query_len + t
            row = torch.empty(heads, q.shape[2], dtype=torch.float64)
            for h in range(heads):
                kv_head = h // (heads // kv_heads)
                seen = torch.arange(position + 1)
                if visible_blocks is not None:
                    allowed = visible_blocks[i][t, h].cpu()
                    seen = seen[torch.isin(seen // block_size, allowed)]
                key = k[seen, kv_head].double()
                scores = key @ q[t, h].double() * scale
                row[h] = torch.softmax(scores, dim=0) @ v[seen, kv_head].double()
            rows.append(row)
    return torch.stack(rows)


def bf16_tolerance(reference: torch.Tensor, steps: int = 2) -> torch.Tensor:
    """Per (token, head) row: `steps` bf16 spacings at the row's largest |value| (the output
    magnitude), shaped to broadcast against [T, H, D]."""
    magnitude = reference.abs().amax(dim=-1, keepdim=True).clamp_min(2.0 ** -100)
    spacing = torch.pow(2.0, torch.floor(torch.log2(magnitude)) - 7)  # bf16 keeps 8 bits
    return steps * spacing


def averaged_values_tolerance(values: list[torch.Tensor], queries: list[torch.Tensor],
                              steps: int = 2) -> torch.Tensor:
    """Per token row: `steps` bf16 spacings at the largest |value| of its sequence, [T, 1, 1].

    An attention whose probabilities are rounded to bf16 (as transformers' eager attention rounds
    them) errs by a few bf16 steps of the values it averages, which exceeds the output's own
    spacing when the average cancels."""
    rows = []
    for q, v in zip(queries, values):
        magnitude = v.abs().max().double().clamp_min(2.0 ** -100).cpu()
        rows.append(torch.full((q.shape[0],), steps * 2.0 ** (torch.floor(torch.log2(magnitude)) - 7).item(),
                               dtype=torch.float64))
    return torch.cat(rows)[:, None, None]
