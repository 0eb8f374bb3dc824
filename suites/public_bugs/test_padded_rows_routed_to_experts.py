"""CUDA-graph padding rows routed to MoE experts under data-parallel attention (SGLang #31838, "the
padded rows' router logits are garbage, and without the mask every padded row keeps its unmasked
top-k expert ids through EP dispatch. Since the padded rows are identical, they all pick the same
experts, which skews per-expert dispatch counts and can overflow per-expert buffers":
https://github.com/sgl-project/sglang/pull/31838; vLLM #46428, padding tokens' top-k set to -1:
https://github.com/vllm-project/vllm/pull/46428; SGLang #30895: padded rows entering the expert
path: https://github.com/sgl-project/sglang/pull/30895). The expert layer runs on the tokens of two
DP ranks, each padded to its graph's batch of 4 and gathered rank by rank, so rank 0's padding rows
come before rank 1's real tokens. Every expert has a static buffer of 2 tokens (a captured kernel
needs static shapes), filled in token order; a token past it is dropped. Rank 0's two identical pad
rows all route to expert 0 and fill its buffer, and rank 1's two tokens for expert 0 are dropped:
their outputs lose the expert's contribution, silently on CUDA as on the emulated device (nothing
to refuse), and differ from the eager step, which runs the 5 real tokens unpadded. Fixed: the
padded rows' expert ids are set to -1 from the device's count of real rows of each rank, and a -1
takes no place in any buffer."""

from __future__ import annotations

import torch

EXPERTS, CAPACITY, CAPTURED = 4, 2, 4
REAL_EXPERTS = ((1, 2), (0, 0, 3))  # the expert each rank's real tokens pick


def _tokens(experts) -> torch.Tensor:
    return 5.0 * torch.nn.functional.one_hot(torch.tensor(experts), EXPERTS).float().to("cuda")


class ExpertLayer:
    def __init__(self, *, masks_padding: bool) -> None:
        self.masks_padding = masks_padding
        self.router = torch.eye(EXPERTS, device="cuda")
        self.scale = torch.arange(2.0, EXPERTS + 2, device="cuda")  # expert e multiplies by e + 2
        self.load = torch.zeros(EXPERTS, device="cuda")

    def __call__(self, hidden: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        expert = (hidden @ self.router).argmax(1)
        if self.masks_padding:
            expert = torch.where(real, expert, -1)  # _mask_topk_ids_padded_region
        routed = torch.nn.functional.one_hot(expert.clamp(min=0), EXPERTS) * (expert >= 0).unsqueeze(1)
        place = (routed.cumsum(0) * routed).sum(1) - 1  # the token's slot in its expert's buffer
        kept = (expert >= 0) & (place < CAPACITY)
        self.load += routed.sum(0)
        return hidden + torch.where(kept, self.scale[expert.clamp(min=0)], 0.0).unsqueeze(1) * hidden


class GatheredStep:
    """The expert layer of both DP ranks' gathered tokens, captured for 4 rows a rank."""

    def __init__(self, *, masks_padding: bool) -> None:
        self.layer = ExpertLayer(masks_padding=masks_padding)
        self.hidden = torch.zeros(2 * CAPTURED, EXPERTS, device="cuda")
        # the real rows of each rank (SGLang's num_token_non_padded, as a mask)
        self.real = torch.zeros(2 * CAPTURED, dtype=torch.bool, device="cuda")
        self.graph = torch.cuda.CUDAGraph()
        self.layer(self.hidden, self.real)  # warmup: the first matmul creates the cuBLAS handle
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph):
            self.out = self.layer(self.hidden, self.real)

    def step(self) -> list[list[list[float]]]:
        self.hidden.zero_()  # the pad rows: identical (here zero) router inputs
        self.real.zero_()
        for rank, experts in enumerate(REAL_EXPERTS):
            rows = slice(rank * CAPTURED, rank * CAPTURED + len(experts))
            self.hidden[rows] = _tokens(experts)
            self.real[rows] = True
        self.layer.load.zero_()
        self.graph.replay()
        torch.cuda.synchronize()
        return [self.out[rank * CAPTURED: rank * CAPTURED + len(experts)].tolist()
                for rank, experts in enumerate(REAL_EXPERTS)]


def _eager() -> list[list[list[float]]]:
    layer = ExpertLayer(masks_padding=False)
    hidden = torch.cat([_tokens(experts) for experts in REAL_EXPERTS])
    out = layer(hidden, torch.ones(hidden.shape[0], dtype=torch.bool, device="cuda"))
    first = len(REAL_EXPERTS[0])
    return [out[:first].tolist(), out[first:].tolist()]


def test_padding_rows_fill_an_experts_buffer_and_drop_real_tokens():
    step = GatheredStep(masks_padding=False)
    graphed, eager = step.step(), _eager()
    assert graphed[0] == eager[0]  # rank 0's own tokens are before its padding
    assert graphed[1][2] == eager[1][2]  # expert 3 had room
    assert graphed[1][:2] != eager[1][:2]  # rank 1's expert-0 tokens were dropped
    assert graphed[1][0] == [5.0, 0.0, 0.0, 0.0] and eager[1][0] == [15.0, 0.0, 0.0, 0.0]
    assert step.layer.load.tolist() == [5.0, 1.0, 1.0, 1.0]  # 3 pad rows counted for expert 0


def test_masked_padding_rows_take_no_place_and_the_step_equals_eager():
    step = GatheredStep(masks_padding=True)
    assert step.step() == _eager()
    assert step.layer.load.tolist() == [2.0, 1.0, 1.0, 1.0]
