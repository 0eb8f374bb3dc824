"""`torch.distributed` on the emulated CUDA device: a backend naming NCCL is refused by name with
the remedy (before distributed.py the CPU wheel said "Distributed package doesn't have NCCL built
in" and a CUDA wheel without a GPU failed at the first collective); gloo runs cuda tensors and is
the default for them, `device_id` included. One rank, through a file store."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="a torch without distributed")


@pytest.fixture
def store(tmp_path):
    yield f"file://{tmp_path}/store"
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("backend", ["nccl", "cpu:gloo,cuda:nccl", dist.Backend.NCCL])
def test_a_backend_naming_nccl_is_refused_with_the_remedy(cuda_device, store, backend):
    with pytest.raises(UnsupportedOnEmulatedDevice, match=r"NCCL[\s\S]*backend='gloo'"):
        dist.init_process_group(backend, init_method=store, rank=0, world_size=1)
    assert not dist.is_initialized()


def test_a_new_nccl_group_is_refused(cuda_device, store):
    dist.init_process_group("gloo", init_method=store, rank=0, world_size=1)
    with pytest.raises(UnsupportedOnEmulatedDevice, match="new_group"):
        dist.new_group([0], backend="nccl")


def test_the_default_backend_with_a_cuda_device_id_runs_collectives_and_captures(cuda_device,
                                                                                 store):
    dist.init_process_group(init_method=store, rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    x = torch.full((4,), 2.0, device="cuda")
    dist.all_reduce(x)
    gathered = [torch.empty(4, device="cuda")]
    dist.all_gather(gathered, x)
    dist.barrier()
    assert x.is_cuda and gathered[0].is_cuda and gathered[0].tolist() == [2.0] * 4
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        dist.all_reduce(x)
    x.fill_(5.0)
    graph.replay()
    torch.cuda.synchronize()
    assert x.tolist() == [5.0] * 4  # one rank: the sum is the tensor itself
