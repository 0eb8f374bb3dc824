"""A diffusion UNet's timestep embedding builds its frequency table on the host at every call and
moves it to the device: `torch.exp(... torch.arange(half) ...).to(device=timesteps.device)`, inside
the captured region (PyTorch #91302: graph-capturing Stable Diffusion's UNet broke on that line of
`timestep_embedding`). A copy from pageable host memory cannot be captured; CUDA refuses it with
Copy.cu's words, and the harness adds the op and the user's line. Fixed: the table is built on the
device once, before capture (a buffer of the module)."""

from __future__ import annotations

import math

import pytest
import torch

from harness.graphs import CaptureError

PAGEABLE = ("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU "
            "tensor is pinned.")
HALF = 4


def _frequencies() -> torch.Tensor:
    return torch.exp(-math.log(10000) * torch.arange(0, HALF, dtype=torch.float32) / HALF)


def timestep_embedding(timesteps: torch.Tensor, table: torch.Tensor | None) -> torch.Tensor:
    freqs = _frequencies().to(device=timesteps.device) if table is None else table
    args = timesteps[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def _capture(table: torch.Tensor | None):
    timesteps = torch.tensor([1.0, 5.0], device="cuda")
    warmup = torch.cuda.Stream()
    warmup.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warmup):
        timestep_embedding(timesteps, table)
    torch.cuda.current_stream().wait_stream(warmup)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        embedding = timestep_embedding(timesteps, table)
    return graph, timesteps, embedding


def test_the_host_built_table_moved_inside_the_capture_is_refused_in_cudas_words():
    with pytest.raises(CaptureError) as refused:
        _capture(table=None)
    assert str(refused.value).startswith(PAGEABLE), refused.value
    assert "test_host_built_constant_in_capture.py" in str(refused.value)


def test_a_table_built_on_the_device_before_capture_replays_new_timesteps():
    table = _frequencies().to("cuda")
    graph, timesteps, embedding = _capture(table)
    timesteps.copy_(torch.tensor([0.0, 2.0]))
    graph.replay()
    expected = timestep_embedding(torch.tensor([0.0, 2.0], device="cuda"), table)
    assert torch.allclose(embedding, expected)
