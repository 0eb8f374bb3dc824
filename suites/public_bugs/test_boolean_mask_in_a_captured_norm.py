"""A synchronized batch norm that drops the ranks without samples with a boolean mask,
`count_all[mask]`, inside a captured step (PyTorch #78549: after PyTorch #74944 graph-capturing
SyncBatchNorm failed with "CUDA error: operation not permitted when stream is capturing", raised
from nonzero's memcpy_and_sync). Boolean-mask indexing sizes its result from the data, so it copies
the count to the host and waits: CUDA refuses it during a capture; the harness gives CUDA's error,
naming the op and the user's line. Fixed: masked arithmetic keeps every shape static."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import CaptureInvalidatedError, CaptureSyncError

from suites.public_bugs._refusals import stream_kept

NOT_PERMITTED = "CUDA error: operation not permitted when stream is capturing"


def _gathered_stats(mean_all: torch.Tensor, count_all: torch.Tensor, *, masked_index: bool):
    """Per-rank means and counts gathered from every rank: the global mean over ranks with data."""
    if masked_index:
        mask = count_all.squeeze(-1) >= 1
        count_all, mean_all = count_all[mask], mean_all[mask]
        return (mean_all * count_all).sum(0) / count_all.sum(0)
    weights = count_all * (count_all >= 1)
    return (mean_all * weights).sum(0) / weights.sum(0).clamp_min(1)


def _captured(masked_index: bool):
    mean_all = torch.tensor([[1.0, 2.0], [9.0, 9.0], [3.0, 4.0]], device="cuda")
    count_all = torch.tensor([[2.0], [0.0], [2.0]], device="cuda")
    warmup = torch.cuda.Stream()
    warmup.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warmup):
        _gathered_stats(mean_all, count_all, masked_index=masked_index)
    torch.cuda.current_stream().wait_stream(warmup)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mean = _gathered_stats(mean_all, count_all, masked_index=masked_index)
    return graph, mean, mean_all, count_all


def test_a_boolean_mask_inside_the_capture_is_refused_in_cudas_words():
    # as on CUDA, capture_end fails after the refused call, which is its context
    with stream_kept(), pytest.raises(CaptureInvalidatedError) as ended:
        _captured(masked_index=True)
    refused = ended.value.__context__
    assert isinstance(refused, CaptureSyncError), refused
    assert str(refused).startswith(NOT_PERMITTED), refused
    assert "test_boolean_mask_in_a_captured_norm.py" in str(refused)  # the user's line


def test_masked_arithmetic_captures_and_follows_new_counts():
    graph, mean, mean_all, count_all = _captured(masked_index=False)
    graph.replay()
    assert mean.tolist() == [2.0, 3.0]
    count_all.copy_(torch.tensor([[0.0], [1.0], [3.0]]))
    graph.replay()
    assert mean.tolist() == [(9.0 + 9.0) / 4, (9.0 + 12.0) / 4]
