"""Foreach and fused optimizers group their tensors by device: on the emulated device the groups
are keyed `cuda:N` as on CUDA, so a fused optimizer under a GradScaler captures."""

from __future__ import annotations

import torch


def test_tensor_groups_are_keyed_by_the_emulated_device_and_kept_apart_from_host(cuda_device):
    a, b, host = torch.ones(3, device="cuda"), torch.ones(2, device="cuda"), torch.ones(2)
    groups = torch.utils._foreach_utils._group_tensors_by_device_and_dtype([[a, b, host]], True)
    assert {key: indices for key, (_, indices) in groups.items()} == {
        (torch.device("cuda", 0), torch.float32): [0, 1],
        (torch.device("cpu"), torch.float32): [2],
    }


def test_a_fused_optimizer_step_under_a_grad_scaler_captures_and_replays(cuda_device):
    weight = torch.ones(4, device="cuda", requires_grad=True)
    opt = torch.optim.Adam([weight], lr=0.1, fused=True, capturable=True)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0)
    weight.grad = torch.full_like(weight, 2.0)
    scaler._lazy_init_scale_growth_tracker(weight.device)  # what scaler.scale(loss) does first
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        scaler.step(opt)  # warmup: the optimizer's state exists before capture
        scaler.update()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        scaler.step(opt)
        scaler.update()
    before = weight.detach().clone()
    g.replay()
    assert not torch.equal(weight.detach(), before)


def test_a_fused_optimizer_with_host_tensor_betas_captures_and_replays(cuda_device):
    # torch's own optimizer inputs pass lr and betas as cpu 0-dim tensors; the fused kernel reads
    # the betas as doubles inside the device op: a host read, not a sync (CUDA captures it).
    weight = torch.ones(4, device="cuda", requires_grad=True)
    opt = torch.optim.Adam([weight], lr=torch.tensor(0.1), betas=(torch.tensor(0.9), torch.tensor(0.99)),
                           fused=True, capturable=True)
    weight.grad = torch.full_like(weight, 2.0)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        opt.step()  # warmup: the optimizer's state exists before capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        opt.step()
    before = weight.detach().clone()
    g.replay()
    assert torch.all(weight.detach() < before)
