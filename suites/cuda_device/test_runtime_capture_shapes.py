"""Calls public runtimes' capture code makes, answered as CUDA answers them. Each row failed on the
emulated device until 2026-12-06 (found running the shapes of SGLang's CudaGraphRunner, vLLM's
piecewise CUDAGraphWrapper, gpt-fast and transformers' static cache under the emulation); the
`cuda_kind` rows show CUDA's own answer on a GPU."""

from __future__ import annotations

import pytest
import torch

import harness


def _weak_ref(t: torch.Tensor) -> torch.Tensor:
    """A tensor over `t`'s memory that does not own it, as vLLM keeps its captured outputs."""
    storage = torch._C._construct_storage_from_data_pointer(
        t.untyped_storage().data_ptr(), t.device, t.untyped_storage().nbytes())
    return torch.empty((), dtype=t.dtype, device=t.device).set_(
        storage, t.storage_offset(), t.shape, t.stride())


def test_a_storage_made_from_a_device_pointer_is_device_memory(cuda_kind):
    x = torch.arange(12.0, device="cuda").view(3, 4)
    weak = _weak_ref(x)
    assert weak.device == x.device and weak.shape == (3, 4)
    assert weak.data_ptr() == x.data_ptr()
    x.add_(1)
    assert weak.sum().item() == 78.0


def test_metadata_changes_in_a_capture_happen_when_it_meets_them(cuda_kind):
    x = torch.arange(6.0, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x * 2
        y.unsqueeze_(0)
        shape_in_capture = tuple(y.shape)
        weak = _weak_ref(y)
    assert shape_in_capture == (1, 6)
    assert weak.shape == (1, 6)
    x.fill_(1.0)
    graph.replay()
    torch.cuda.synchronize()
    assert weak.tolist() == [[2.0] * 6]


def test_a_wrapped_set_stream_sees_each_stream_context(cuda_kind, monkeypatch):
    seen = []
    original = torch.cuda.set_stream

    def wrapped(stream):  # vLLM's utils follow the current stream so
        seen.append(stream)
        original(stream)

    monkeypatch.setattr(torch.cuda, "set_stream", wrapped)
    before = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert torch.cuda.current_stream() == side
    assert seen == [side, before]
    assert torch.cuda.current_stream() == before


def test_a_set_stream_wrapped_before_entering_stays_in_use(outside_emulation, monkeypatch):
    seen = []
    original = torch.cuda.set_stream

    def wrapped(stream):
        seen.append(stream)
        original(stream)

    monkeypatch.setattr(torch.cuda, "set_stream", wrapped)
    with harness.emulate_cuda(device="cpu"):
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            pass
        torch.cuda.set_stream(side)
        assert torch.cuda.current_stream() == side
        torch.cuda.set_stream(torch.cuda.default_stream())
    assert len(seen) == 4
    assert torch.cuda.set_stream is wrapped


def test_a_dynamic_compile_reading_a_float_argument_runs(cuda_kind):
    torch._dynamo.reset()

    def scale(logits, temperature: float = 1.0):
        return torch.softmax(logits / max(temperature, 1e-5), dim=-1)

    compiled = torch.compile(scale, dynamic=True, fullgraph=True)
    logits = torch.linspace(-1.0, 1.0, 8, device="cuda")
    for temperature in (0.5, 2.0):
        got = compiled(logits, temperature)
        assert torch.allclose(got, scale(logits, temperature))
    torch._dynamo.reset()
