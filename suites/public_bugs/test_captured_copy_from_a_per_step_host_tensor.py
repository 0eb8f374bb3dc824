"""A decode step that uploads the step's token ids inside the captured region: the runtime builds
a new pinned host tensor each step and copies it into the static input with `non_blocking=True`
in the graphed step. The capture records that copy as a memcpy node holding the capture-time host
address (a pinned copy is allowed in capture; PyTorch #166765's example re-reads the host tensor at
each replay: https://github.com/pytorch/pytorch/pull/166765 ; ONNX Runtime #32121, a staging buffer
handed back while the graph's copy node still reads it:
https://github.com/microsoft/onnxruntime/pull/32121). Every replay copies the capture step's ids:
the model decodes the first step's tokens again. CUDA refuses nothing; the emulated device replays
the captured host address the same way. Fixed: one pinned staging tensor, refilled in place
before each replay, so the captured node copies the step's ids. The same copy from pageable
memory is refused at capture, with Copy.cu's text. On a GPU the file runs on CUDA itself."""

from __future__ import annotations

import pytest
import torch


STEPS = ((3, 1, 4, 1), (5, 9, 2, 6), (5, 3, 5, 8))
VOCAB = 16


# CUDA where there is one, else the emulated device (conftest.py)
RUNS_NATIVELY_ON_A_GPU = True


class Decoder:
    def __init__(self, *, refills_in_place: bool) -> None:
        self.in_place = refills_in_place
        self.embedding = torch.arange(VOCAB, dtype=torch.float32, device="cuda") * 10
        self.input_ids = torch.zeros(4, dtype=torch.long, device="cuda")
        self.logits = torch.zeros(4, device="cuda")
        self.staging = torch.zeros(4, dtype=torch.long).pin_memory()
        self.host_ids: list[torch.Tensor] = []  # kept for the async output bookkeeping
        self.graph = torch.cuda.CUDAGraph()

    def _host_tensor(self, ids) -> torch.Tensor:
        if self.in_place:
            self.staging.copy_(torch.tensor(ids))
            return self.staging
        self.host_ids.append(torch.tensor(ids).pin_memory())
        return self.host_ids[-1]

    def body(self, host: torch.Tensor) -> None:
        self.input_ids.copy_(host, non_blocking=True)
        self.logits.copy_(self.embedding[self.input_ids] + 1)

    def run(self) -> list[list[float]]:
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph):
            self.body(self._host_tensor(STEPS[0]))
        outputs = []
        for ids in STEPS:
            host = self._host_tensor(ids)  # the step's ids, where the runtime puts them
            self.graph.replay()
            torch.cuda.synchronize()
            outputs.append(self.logits.tolist())
            del host
        return outputs


def _expected(ids) -> list[float]:
    return [i * 10.0 + 1 for i in ids]


def test_every_replay_uploads_the_capture_steps_ids():
    outputs = Decoder(refills_in_place=False).run()
    assert outputs[0] == _expected(STEPS[0])
    assert outputs[1] == _expected(STEPS[0]) != _expected(STEPS[1])  # the first step's tokens again
    assert outputs[2] == _expected(STEPS[0])


def test_a_staging_tensor_refilled_in_place_uploads_each_steps_ids():
    assert Decoder(refills_in_place=True).run() == [_expected(ids) for ids in STEPS]


def test_the_same_upload_from_pageable_memory_is_refused_at_capture():
    input_ids = torch.zeros(4, dtype=torch.long, device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"Cannot copy between CPU and CUDA tensors during CUDA "
                       r"graph capture unless the CPU tensor is pinned"):
        with torch.cuda.graph(graph):
            input_ids.copy_(torch.tensor(STEPS[0]), non_blocking=True)
