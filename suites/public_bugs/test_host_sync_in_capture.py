"""A host sync inside the captured region: `.item()` of the longest sequence to size a kernel
(vLLM #48749, PyTorch #196133). CUDA refuses it (operation not permitted when stream is capturing);
the harness names the op and the user's line. Fixed: the host value comes from the host batch."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import CaptureError

from suites.public_bugs._refusals import stream_kept


def _decode(seq_lens: torch.Tensor, out: torch.Tensor, max_len: int | None) -> None:
    longest = int(seq_lens.max().item()) if max_len is None else max_len
    out.copy_(seq_lens.float() / longest)


def test_item_inside_the_capture_is_named():
    seq_lens = torch.tensor([3, 5, 2], device="cuda")
    out = torch.zeros(3, device="cuda")
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with stream_kept(), pytest.raises((CaptureError, RuntimeError)) as caught:
        with torch.cuda.graph(graph):
            _decode(seq_lens, out, None)
    assert "test_host_sync_in_capture.py" in str(caught.value)  # the user's line
    assert "_local_scalar_dense" in str(caught.value) or "item" in str(caught.value)


def test_the_host_side_length_captures_and_replays():
    seq_lens = torch.tensor([3, 5, 2], device="cuda")
    out = torch.zeros(3, device="cuda")
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        _decode(seq_lens, out, 8)
    seq_lens.copy_(torch.tensor([4, 4, 8]))
    graph.replay()
    assert out.tolist() == [0.5, 0.5, 1.0]
