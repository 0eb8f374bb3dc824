"""A captured attention step that masks its scores with `masked_fill(mask, value)` where the fill
value is a 0-dim tensor on the device (a buffer the layer registered, or a reduction's result:
PyTorch #190512, open: "the copy is also illegal during CUDA graph capture, so the op cannot be
captured"). CUDA's masked_fill passes the value to its kernel as a host scalar, `value.item()`
(Indexing.cu), a copy to the host and a stream sync that the capture refuses; a Python number or a
host tensor costs nothing. The harness gives CUDA's error, naming the op and the user's line.
Fixed: `torch.where(mask, value, scores)` reads the value on the device."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import CaptureInvalidatedError, CaptureSyncError

from suites.public_bugs._refusals import stream_kept

NOT_PERMITTED = "CUDA error: operation not permitted when stream is capturing"


class MaskedScores(torch.nn.Module):
    def __init__(self, *, where: bool):
        super().__init__()
        self.where = where
        self.register_buffer("fill", torch.tensor(torch.finfo(torch.float32).min))

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        scores = q @ k.mT
        future = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
        if self.where:
            scores = torch.where(future, self.fill, scores)
        else:
            scores = scores.masked_fill(future, self.fill)
        return scores.softmax(-1)


def _captured(where: bool):
    layer = MaskedScores(where=where).to("cuda")
    q, k = torch.zeros(2, 4, 8, device="cuda"), torch.zeros(2, 4, 8, device="cuda")
    warmup = torch.cuda.Stream()
    warmup.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warmup):
        for _ in range(3):
            layer(q, k)
    torch.cuda.current_stream().wait_stream(warmup)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        probs = layer(q, k)
    return graph, layer, q, k, probs


def test_masked_fill_of_a_device_value_is_refused_in_cudas_words():
    # as on CUDA, capture_end fails after the refused call, which is its context
    with stream_kept(), pytest.raises(CaptureInvalidatedError) as ended:
        _captured(where=False)
    refused = ended.value.__context__
    assert isinstance(refused, CaptureSyncError), refused
    assert str(refused).startswith(NOT_PERMITTED), refused
    assert "aten.masked_fill" in str(refused) and "value.item()" in str(refused)
    assert "test_masked_fill_of_a_device_value_in_capture.py" in str(refused)


def test_where_captures_and_masks_each_replay():
    graph, layer, q, k, probs = _captured(where=True)
    for seed in (1, 2):
        generator = torch.Generator().manual_seed(seed)
        new_q = torch.randn(2, 4, 8, generator=generator)
        new_k = torch.randn(2, 4, 8, generator=generator)
        q.copy_(new_q)
        k.copy_(new_k)
        graph.replay()
        assert torch.allclose(probs, layer(new_q.cuda(), new_k.cuda()), atol=1e-6)
        assert probs.triu(1).abs().max().item() == 0.0  # no weight on a future position
