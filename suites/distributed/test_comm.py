"""comm.py in one process: the trivial comm, the backend choice by device, and a world of one."""

from __future__ import annotations

import contextlib
import datetime

import pytest
import torch
import torch.distributed as dist

import harness
from harness.emulation import emulation_active

from harness.runtime.comm import SingleProcessComm, TorchDistributedComm, default_comm, process_group_backend


def test_one_process_gathers_its_own_answer():
    comm = default_comm()
    assert isinstance(comm, SingleProcessComm)
    assert comm.allgather_object({"moved": True}) == [{"moved": True}] and comm.barrier() is None


@pytest.mark.parametrize("device, backend", [("cpu", "gloo"), (torch.device("cpu"), "gloo"),
                                             ("cuda", "nccl"), ("cuda:1", "nccl")])
def test_the_process_group_backend_follows_the_device(device, backend):
    on_the_emulated_device = emulation_active() == "cpu" and torch.device(device).type == "cuda"
    assert process_group_backend(device) == ("gloo" if on_the_emulated_device else backend)


def test_torch_distributed_comm_needs_a_process_group():
    with pytest.raises(RuntimeError, match="needs an initialized default process group"):
        TorchDistributedComm("cpu")


def test_a_gloo_world_of_one_agrees_with_itself(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        comm = default_comm("cpu")
        assert isinstance(comm, TorchDistributedComm) and (comm.rank, comm.world_size) == (0, 1)
        assert comm.allgather_object([4, 2]) == [[4, 2]]
        comm.barrier()
        if emulation_active() == "cpu":  # the emulated device's cuda tensors go over gloo
            assert TorchDistributedComm("cuda").device.type == "cuda"
        else:
            with pytest.raises(ValueError,
                               match="process group backend 'gloo' does not carry tensors on cuda"):
                TorchDistributedComm("cuda")
    finally:
        dist.destroy_process_group()


def test_agree_on_graph_key_without_a_process_group_is_one_rank_agreeing():
    from harness.check import agree_on_graph_key

    assert agree_on_graph_key("decode bs=4") is None


def test_agree_on_graph_key_in_a_gloo_world_of_one_gathers_its_own_key(tmp_path):
    from harness.check import agree_on_graph_key

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        agree_on_graph_key("decode bs=4 ü", timeout=datetime.timedelta(seconds=10))
        agree_on_graph_key("", timeout=datetime.timedelta(seconds=10))  # an empty key gathers too
    finally:
        dist.destroy_process_group()


def test_the_emulated_devices_tensors_go_over_gloo(tmp_path):
    """On the emulated CUDA device cuda tensors are host memory: the engine's rank agreement runs
    over gloo there, where it asked for nccl (which the device cannot carry) before."""
    if emulation_active() == "cuda" or (emulation_active() is None and torch.cuda.is_available()):
        pytest.skip("the emulated CUDA device is checked without a GPU")
    with contextlib.ExitStack() as stack:
        if emulation_active() is None:
            stack.enter_context(harness.emulate_cuda(device="cpu"))
        assert process_group_backend("cuda") == "gloo"
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                                world_size=1)
        try:
            comm = TorchDistributedComm("cuda")
            assert comm.allgather_object({"key": 4}) == [{"key": 4}]
            comm.barrier()
        finally:
            dist.destroy_process_group()
