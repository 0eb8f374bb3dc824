"""A captured logits processor bans tokens with `logits[banned] = self.floor`, where `floor` is a
0-dim buffer the module registered (it moves to the device with the module). `x[mask] = value`
is index_put_ with a boolean index: ATen turns it into masked_fill_ only for a number or a
one-element host value (canDispatchToMaskedFill); a device value keeps the boolean index, which
CUDA expands with `nonzero`, a host sync that the capture refuses ("index_put_ with boolean tensor
indices ... triggers nonzero during CUDA graph capture": PyTorch #170262, where inductor now
partitions the graph around it). The emulated device judged the value by ATen's device, cpu for
every emulated tensor, and captured it. Fixed: the floor read once before capture as a Python
number, or `torch.where(banned, floor, logits)`, which reads it on the device."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import CaptureInvalidatedError, CaptureSyncError

from suites.public_bugs._refusals import stream_kept

NOT_PERMITTED = "CUDA error: operation not permitted when stream is capturing"


class BanTokens(torch.nn.Module):
    def __init__(self, vocab: int, banned: list[int], *, fix: str | None):
        super().__init__()
        self.fix = fix
        mask = torch.zeros(vocab, dtype=torch.bool)
        mask[banned] = True
        self.register_buffer("banned", mask)
        self.register_buffer("floor", torch.tensor(-1e4))
        self.floor_value = float(self.floor)  # read on the host before any capture

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.clone()
        banned = self.banned.expand_as(logits)
        if self.fix == "where":
            return torch.where(banned, self.floor, logits)
        logits[banned] = self.floor_value if self.fix == "number" else self.floor
        return logits


def _captured(fix: str | None):
    processor = BanTokens(16, [0, 3, 7], fix=fix).to("cuda")
    logits = torch.zeros(2, 16, device="cuda")
    warmup = torch.cuda.Stream()
    warmup.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warmup):
        for _ in range(3):
            processor(logits)
    torch.cuda.current_stream().wait_stream(warmup)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = processor(logits)
    return graph, processor, logits, out  # the processor's buffers live as long as the graph


def test_a_mask_assigned_a_device_value_is_refused_in_cudas_words():
    # as on CUDA, capture_end fails after the refused call, which is its context
    with stream_kept(), pytest.raises(CaptureInvalidatedError) as ended:
        _captured(fix=None)
    refused = ended.value.__context__
    assert isinstance(refused, CaptureSyncError), refused
    assert str(refused).startswith(NOT_PERMITTED), refused
    assert "aten.index_put_" in str(refused) and "boolean-mask" in str(refused)
    assert "test_mask_assigned_a_device_value_in_capture.py" in str(refused)


@pytest.mark.parametrize("fix", ["number", "where"])
def test_a_number_or_where_captures_and_bans_at_each_replay(fix):
    graph, _processor, logits, out = _captured(fix)
    for seed in (1, 2):
        new = torch.randn(2, 16, generator=torch.Generator().manual_seed(seed))
        logits.copy_(new.to("cuda"))
        graph.replay()
        torch.cuda.synchronize()
        expected = new.clone()
        expected[:, [0, 3, 7]] = -1e4
        assert torch.equal(out.cpu(), expected)
