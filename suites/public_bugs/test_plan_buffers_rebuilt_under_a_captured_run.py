"""An attention wrapper made without its CUDA-graph mode, whose `run()` is captured anyway: each
`plan()` builds the step's index buffers anew, so the captured run keeps reading the buffers the
plan before capture made (flashinfer #3904, from vLLM #48167: a captured non-CUDA-graph-mode prefill
wrapper "silently returns wrong output, then an illegal memory access as sequences grow"; near-zero
speculative-decoding acceptance). On CUDA the replay reads whatever the allocator put there since;
the harness refuses the replay (`FreedMemoryError`, naming the buffer and the capture's line).
Fixed: the CUDA-graph mode keeps persistent buffers that `plan()` copies into."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import FreedMemoryError

PAGES, PAGE_SIZE = 6, 4


class DecodeWrapper:
    def __init__(self, *, use_cuda_graph: bool, batch: int) -> None:
        self.use_cuda_graph = use_cuda_graph
        if use_cuda_graph:  # persistent buffers, as the CUDA-graph mode allocates them
            self.page_of = torch.zeros(batch, dtype=torch.int64, device="cuda")
            self.last_len = torch.zeros(batch, dtype=torch.int64, device="cuda")

    def plan(self, page_of: list[int], last_len: list[int]) -> None:
        page_of_host = torch.tensor(page_of).pin_memory()
        last_len_host = torch.tensor(last_len).pin_memory()
        if self.use_cuda_graph:
            self.page_of.copy_(page_of_host, non_blocking=True)
            self.last_len.copy_(last_len_host, non_blocking=True)
        else:  # the default mode: fresh device buffers at every plan
            self.page_of = page_of_host.to("cuda", non_blocking=True)
            self.last_len = last_len_host.to("cuda", non_blocking=True)
        torch.cuda.current_stream().synchronize()  # the pinned staging dies with this call

    def run(self, kv: torch.Tensor, out: torch.Tensor) -> None:
        rows = kv[self.page_of]  # (batch, PAGE_SIZE)
        positions = torch.arange(PAGE_SIZE, device="cuda")
        valid = positions[None, :] < self.last_len[:, None]
        out.copy_((rows * valid).sum(-1))


def _decode_steps(use_cuda_graph: bool) -> list[list[float]]:
    kv = torch.arange(PAGES * PAGE_SIZE, dtype=torch.float32, device="cuda").view(PAGES, PAGE_SIZE)
    out = torch.zeros(2, device="cuda")
    wrapper = DecodeWrapper(use_cuda_graph=use_cuda_graph, batch=2)
    wrapper.plan([0, 1], [1, 1])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        wrapper.run(kv, out)
    results = []
    for page_of, last_len in (([2, 3], [2, 3]), ([5, 4], [4, 1])):
        wrapper.plan(page_of, last_len)
        graph.replay()
        results.append(out.tolist())
    return results


def test_a_captured_run_of_a_wrapper_that_plans_into_fresh_buffers_is_refused():
    with pytest.raises(FreedMemoryError) as refused:
        _decode_steps(use_cuda_graph=False)
    assert "test_plan_buffers_rebuilt_under_a_captured_run.py" in str(refused.value)


def test_persistent_plan_buffers_give_each_steps_pages():
    # page 2 holds 8..11, page 3 12..15, page 5 20..23, page 4 16..19
    assert _decode_steps(use_cuda_graph=True) == [[8.0 + 9.0, 12.0 + 13.0 + 14.0],
                                                  [20.0 + 21.0 + 22.0 + 23.0, 16.0]]
