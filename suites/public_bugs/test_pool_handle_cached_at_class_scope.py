"""A graph pool id cached at class scope and reused by a second engine in the same process
(TensorRT-LLM #16952: https://github.com/NVIDIA/TensorRT-LLM/pull/16952, and #16995:
https://github.com/NVIDIA/TensorRT-LLM/pull/16995; a torch.compile backend kept
`_graph_pool_handle` as a class attribute). The first engine resets its graphs at teardown, which
gives back the pool's last use, while a tensor its capture allocated in the pool is still held (its
last output); the second engine's capture names the same id. CUDA's caching allocator keeps that
pool, unused, until it can free all of it, and a capture into it fails the allocator's internal
assert `use_count > 0` (a RuntimeError from capture_begin); the emulated device raises the same.
Fixed: each engine takes its own id (or its first capture makes the pool and later graphs share
it through `graph.pool()`)."""

from __future__ import annotations

import pytest
import torch

ASSERT = r"use_count > 0 INTERNAL ASSERT FAILED"


def backend_class():
    """A fresh backend class per test: its class attribute is the process-wide cache."""

    class Backend:
        _graph_pool_handle = None

        @classmethod
        def pool(cls):
            if cls._graph_pool_handle is None:
                cls._graph_pool_handle = torch.cuda.graph_pool_handle()
            return cls._graph_pool_handle

    return Backend


class Engine:
    def __init__(self, backend, *, pool_per_engine: bool) -> None:
        self.pool = torch.cuda.graph_pool_handle() if pool_per_engine else backend.pool()
        self.x = torch.ones(8, device="cuda")
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=self.pool):
            self.out = self.x * 2  # the graph's output lives in the pool

    def generate(self, value: float) -> torch.Tensor:
        self.x.fill_(value)
        self.graph.replay()
        return self.out

    def release_graphs(self) -> None:
        self.graph.reset()


def _two_engines(*, pool_per_engine: bool) -> tuple[torch.Tensor, torch.Tensor]:
    backend = backend_class()
    first = Engine(backend, pool_per_engine=pool_per_engine)
    last_output = first.generate(3.0)  # still held by the caller
    first.release_graphs()
    second = Engine(backend, pool_per_engine=pool_per_engine)
    return last_output, second.generate(5.0)


def test_a_second_engine_capturing_into_the_released_class_pool_fails_the_allocators_assert():
    stream = torch.cuda.current_stream()
    try:
        with pytest.raises(RuntimeError, match=ASSERT):
            _two_engines(pool_per_engine=False)
    finally:
        torch.cuda.set_stream(stream)  # graph()'s __enter__ switched streams before it failed


def test_an_engine_with_its_own_pool_captures_and_replays():
    last_output, second = _two_engines(pool_per_engine=True)
    assert last_output.tolist() == [6.0] * 8
    assert second.tolist() == [10.0] * 8
