"""The workspace regrows by reallocation, and says so."""

from __future__ import annotations

import pytest
import torch

from harness.ops import Workspace


def test_grows_only_when_a_request_exceeds_capacity() -> None:
    workspace = Workspace(torch.float32)
    first = workspace.get(10)
    buffer = workspace.tensor
    assert workspace.get(4).data_ptr() == first.data_ptr()
    assert workspace.growths == 1 and workspace.capacity == 10
    grown = workspace.get(11)
    assert workspace.growths == 2 and workspace.capacity == 11
    assert workspace.tensor is not buffer  # reallocated: a graph holding `buffer` would go stale
    assert grown.untyped_storage().data_ptr() == workspace.tensor.untyped_storage().data_ptr()


def test_views_share_the_buffer() -> None:
    workspace = Workspace(torch.bfloat16)
    workspace.get(8).fill_(3.0)
    assert workspace.tensor.eq(3.0).all()
    assert workspace.get(0).numel() == 0


def test_negative_request_raises() -> None:
    with pytest.raises(ValueError, match="-1"):
        Workspace(torch.float32).get(-1)


def test_grown_under_inference_mode_serves_calls_outside_it() -> None:
    # A model shared by an inference-mode caller and a no_grad one (the lint test and an engine
    # test in one pytest worker) wrote into an inference tensor and failed.
    workspace = Workspace(torch.float32)
    with torch.inference_mode():
        workspace.get(8).fill_(1.0)
    workspace.get(8).copy_(torch.arange(8.0))
    assert torch.equal(workspace.get(8), torch.arange(8.0))
