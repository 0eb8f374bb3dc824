"""What a device tensor and a graph pool say they are, as on CUDA: `x.type()` names CUDA's legacy
type, `x.type(T)` converts across the memories, and pool ids are CUDA's `(int, int)` tuples.
The `native` ids show CUDA's own answers on a GPU."""

from __future__ import annotations

import pytest
import torch

LEGACY = {torch.float32: "FloatTensor", torch.float16: "HalfTensor",
          torch.bfloat16: "BFloat16Tensor", torch.float64: "DoubleTensor",
          torch.int64: "LongTensor", torch.int32: "IntTensor", torch.int16: "ShortTensor",
          torch.int8: "CharTensor", torch.uint8: "ByteTensor", torch.bool: "BoolTensor"}


@pytest.mark.parametrize("dtype", list(LEGACY), ids=str)
def test_a_device_tensor_names_cudas_legacy_type(cuda_kind, dtype):
    x = torch.ones(2, dtype=dtype, device="cuda")
    assert x.type() == f"torch.cuda.{LEGACY[dtype]}"
    assert torch.ones(2, dtype=dtype).type() == f"torch.{LEGACY[dtype]}"
    assert x.is_cuda and x.device.type == "cuda"


def test_type_with_a_type_converts_across_the_memories(cuda_kind):
    x = torch.ones(2, device="cuda")
    half = x.type(torch.cuda.HalfTensor)
    assert half.is_cuda and half.dtype == torch.float16
    host = x.type("torch.DoubleTensor")
    assert not host.is_cuda and host.dtype == torch.float64
    moved = torch.ones(2).type(torch.cuda.LongTensor)
    assert moved.is_cuda and moved.type() == "torch.cuda.LongTensor"
    assert x.type(torch.float64).type() == "torch.cuda.DoubleTensor"
    assert x.type(torch.cuda.FloatTensor) is x  # already that type: the tensor itself


def test_pool_ids_are_cudas_int_pairs_and_graphs_share_them(cuda_kind):
    handle = torch.cuda.graph_pool_handle()
    assert type(handle) is tuple and len(handle) == 2 and all(type(i) is int for i in handle)
    assert handle != torch.cuda.graph_pool_handle()
    x = torch.ones(4, device="cuda")
    torch.cuda.synchronize()
    first, second, own = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(first, pool=handle):
        y = x * 2
    with torch.cuda.graph(second, pool=first.pool()):
        z = y + 1
    with torch.cuda.graph(own):
        w = x * 3
    assert first.pool() == second.pool() == handle
    assert type(own.pool()) is tuple and own.pool() != handle
    x.fill_(2.0)
    first.replay()
    second.replay()
    own.replay()
    torch.cuda.synchronize()
    assert z.tolist() == [5.0] * 4 and w.tolist() == [6.0] * 4


def test_a_pool_that_is_no_pool_id_is_refused(cuda_device):
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(torch.cuda.Stream()):
        with pytest.raises(TypeError, match=r"pool must be a pool id .* got 'a pool'"):
            graph.capture_begin(pool="a pool")
