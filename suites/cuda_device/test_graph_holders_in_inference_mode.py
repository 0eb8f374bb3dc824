"""The generators' graph seed and offset holders are normal tensors even when a capture inside
`torch.inference_mode()` makes them: every build makes them with inference mode off
(`c10::InferenceMode guard(false)`, pytorch/pytorch#172706), so the fills that come after the
block, at each replay of a graph that drew (every build) and at each later capture while the
state's pair lives (up to torch 2.11, one pair per generator state), may write them. PyTorch's
test_cuda_graph_inference_mode checks the second; an inference tensor there raises "Inplace
update to inference tensor outside InferenceMode is not allowed"."""

from __future__ import annotations

import torch


def test_a_graph_captured_in_inference_mode_draws_anew_at_replays_after_the_block(cuda_kind):
    with torch.inference_mode():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            drawn = torch.rand(64, device="cuda")
    graph.replay()  # fills the holders with the generator's seed and offset
    first = drawn.clone()
    graph.replay()
    assert not torch.equal(first, drawn)


def test_a_capture_after_the_block_while_its_graph_lives(cuda_kind):
    with torch.inference_mode():
        inside = torch.cuda.CUDAGraph()
        with torch.cuda.graph(inside):
            torch.rand(4, device="cuda")
    after = torch.cuda.CUDAGraph()
    with torch.cuda.graph(after):  # up to torch 2.11 fills the state's pair `inside` made
        drawn = torch.rand(64, device="cuda")
    after.replay()
    first = drawn.clone()
    after.replay()
    assert not torch.equal(first, drawn)
    del inside
