"""A capture into a pool id whose graphs are all gone. CUDA's caching allocator counts a private
pool's users (each capture into it takes one, the graph's reset or destruction gives it back) and
keeps a pool at zero users until a release of cached memory (`empty_cache()`, which
`torch.cuda.graph` calls before each capture) finds all of its memory free. A capture naming the
pool before then fails the allocator's `use_count > 0` internal assert, a RuntimeError, in
capture_begin (TensorRT-LLM's class-scoped pool handle reused by a second engine after the first
reset its graphs, with a tensor of the pool still alive: #16952, #16995). Once the release has
erased the pool, the id names a fresh one. The emulated device captured into the old pool in
every case until 2026-12-06."""

from __future__ import annotations

import gc
import re

import pytest
import torch

ASSERT = r"use_count > 0 INTERNAL ASSERT FAILED"

KINDS = ["emulated", pytest.param("native", marks=pytest.mark.gpu)]


def _first_graph(pool):
    x = torch.ones(8, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        y = x * 2
    graph.replay()
    return graph, x, y


def _capture_into(pool, x) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        x.mul_(3)
    return graph


def _refused_capture(pool, x) -> str:
    """The capture's error; torch.cuda.graph's __enter__ has switched streams before it fails, and
    that switch is not undone (as on CUDA): restore the stream for what runs next."""
    before = torch.cuda.current_stream()
    try:
        with pytest.raises(RuntimeError, match=ASSERT) as caught:
            _capture_into(pool, x)
    finally:
        torch.cuda.set_stream(before)
    return str(caught.value)


@pytest.mark.parametrize("cuda_kind", KINDS, indirect=True)
@pytest.mark.parametrize("gone", ["reset", "destroyed"])
def test_a_pool_id_whose_graphs_are_gone_while_its_memory_lives_is_refused(cuda_kind, gone):
    handle = torch.cuda.graph_pool_handle()
    graph, x, held = _first_graph(handle)  # `held`: a tensor of the pool, still alive
    if gone == "reset":
        graph.reset()
    else:
        del graph
        gc.collect()
    _refused_capture(handle, x)
    assert held.tolist() == [2.0] * 8


@pytest.mark.parametrize("cuda_kind", KINDS, indirect=True)
def test_the_pool_of_a_reset_graph_named_by_another_capture_is_refused(cuda_kind):
    graph, x, held = _first_graph(None)
    own = graph.pool()
    graph.reset()
    _refused_capture(own, x)
    del held


@pytest.mark.parametrize("cuda_kind", KINDS, indirect=True)
def test_a_capture_begun_before_any_release_is_refused_with_all_memory_free(cuda_kind):
    handle = torch.cuda.graph_pool_handle()
    graph, x, held = _first_graph(handle)
    graph.reset()
    del held
    second = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        try:
            second.capture_begin(pool=handle)  # no empty_cache() in between, unlike graph()
        except RuntimeError as error:
            refused: RuntimeError | None = error
        else:
            second.capture_end()
            refused = None
    assert refused is not None and re.search(ASSERT, str(refused)), refused


@pytest.mark.parametrize("cuda_kind", KINDS, indirect=True)
def test_a_pool_erased_by_the_release_is_made_afresh(cuda_kind):
    handle = torch.cuda.graph_pool_handle()
    graph, x, held = _first_graph(handle)
    graph.reset()
    del held  # all of the pool's memory free: graph()'s empty_cache() erases the pool
    second = _capture_into(handle, x)
    x.fill_(1.0)
    second.replay()
    assert x.tolist() == [3.0] * 8


@pytest.mark.parametrize("cuda_kind", KINDS, indirect=True)
def test_a_pool_shared_while_one_of_its_graphs_lives_is_captured_into(cuda_kind):
    handle = torch.cuda.graph_pool_handle()
    graph, x, held = _first_graph(handle)
    second = _capture_into(handle, x)
    x.fill_(1.0)
    second.replay()
    assert x.tolist() == [3.0] * 8
    del graph, held


@pytest.mark.parametrize("cuda_kind", KINDS, indirect=True)
def test_a_mem_pool_and_a_pool_handle_get_distinct_ids(cuda_kind):
    mem_pool = torch.cuda.MemPool()
    handle = torch.cuda.graph_pool_handle()
    later = torch.cuda.MemPool()
    assert len({tuple(mem_pool.id), tuple(handle), tuple(later.id)}) == 3  # one counter on CUDA


@pytest.mark.parametrize("cuda_kind", KINDS, indirect=True)
def test_a_live_mem_pool_keeps_its_id_open_to_captures_after_a_graph_reset(cuda_kind):
    mem_pool = torch.cuda.MemPool()  # holds a use of its pool while it lives
    graph, x, held = _first_graph(mem_pool.id)
    graph.reset()
    second = _capture_into(mem_pool.id, x)
    x.fill_(1.0)
    second.replay()
    assert x.tolist() == [3.0] * 8
    del second, held


@pytest.mark.parametrize("cuda_kind", KINDS, indirect=True)
def test_a_graph_captured_into_a_mem_pool_holds_a_use_of_it(cuda_kind):
    mem_pool = torch.cuda.MemPool()
    assert mem_pool.use_count() == 1
    graph, x, held = _first_graph(mem_pool.id)
    assert mem_pool.use_count() == 2  # CUDA's count: the MemPool and the graph
    graph.reset()
    assert mem_pool.use_count() == 1
    del held
