"""A captured step that solves a linear system with `torch.linalg.solve` (PyTorch #96632: a capture
of `torch.linalg.solve(A, b)` failed as "Invalid capture" where `torch.matmul` captured). CUDA's
solver reads its info codes on the host to raise on a singular matrix (`_linalg_check_errors`:
`infos.any().item()`), a sync that CUDA refuses during a capture; the harness gives CUDA's error,
naming the op and the user's line. Fixed: `torch.linalg.solve_ex` (check_errors=False) is captured,
and the step checks `info` on the host after the replay."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import CaptureInvalidatedError, CaptureSyncError

from suites.public_bugs._refusals import stream_kept

NOT_PERMITTED = "CUDA error: operation not permitted when stream is capturing"


def _system(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    m = torch.randn(8, 8, generator=generator)
    return (m @ m.mT + 8 * torch.eye(8)).to("cuda"), torch.randn(8, 1, generator=generator).to("cuda")


def _step(a: torch.Tensor, b: torch.Tensor, *, checked_on_the_host: bool):
    if checked_on_the_host:
        x, info = torch.linalg.solve_ex(a, b)
        return x * 2, info
    return torch.linalg.solve(a, b) * 2, None


def _captured(checked_on_the_host: bool):
    a, b = _system(0)
    warmup = torch.cuda.Stream()
    warmup.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warmup):
        for _ in range(3):
            _step(a, b, checked_on_the_host=checked_on_the_host)
    torch.cuda.current_stream().wait_stream(warmup)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x, info = _step(a, b, checked_on_the_host=checked_on_the_host)
    return graph, a, b, x, info


def test_a_solve_that_checks_for_singular_matrices_is_refused_in_cudas_words():
    # as on CUDA, capture_end fails after the refused call, which is its context
    with stream_kept(), pytest.raises(CaptureInvalidatedError) as ended:
        _captured(checked_on_the_host=False)
    refused = ended.value.__context__
    assert isinstance(refused, CaptureSyncError), refused
    assert str(refused).startswith(NOT_PERMITTED), refused
    assert "_linalg_check_errors" in str(refused)
    assert "test_linear_solve_in_capture.py" in str(refused)  # the user's line


def test_solve_ex_captures_and_solves_each_new_system():
    graph, a, b, x, info = _captured(checked_on_the_host=True)
    for seed in (1, 2):
        new_a, new_b = _system(seed)
        a.copy_(new_a)
        b.copy_(new_b)
        graph.replay()
        assert info.item() == 0  # the host checks after the replay, outside the graph
        assert torch.allclose(x, 2 * torch.linalg.solve(new_a, new_b), atol=1e-5)
