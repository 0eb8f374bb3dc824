"""A user's TorchDispatchMode sees the device's tensors as CUDA shows them
(harness/emulation/user_dispatch_modes.py): inside `__torch_dispatch__` an op's device tensors
say `cuda:N` and `is_cuda`, a factory naming cuda names it, and the results of a device op are on
the device; host tensors and a copy to the host stay cpu. The `cuda_kind` and `two_devices` rows
run natively on GPUs to show CUDA's answer."""

from __future__ import annotations

import gc

import pytest
import torch

import harness
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


class _Seen(TorchDispatchMode):
    """Per op: the devices of its tensor arguments, the type of its `device=` argument (CUDA may
    hand on "cuda" without an index), its results' devices. Ops on one-element int64 tensors
    alone are left out: torch 2.11's CUDA generator makes and fills two such tensors of its own
    at `capture_begin()` through the dispatcher (CUDAGeneratorState::register_graph and
    capture_prologue), which a mode entered before the capture sees natively there."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        flat = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        results = out if isinstance(out, (tuple, list)) else (out,)
        touched = flat + [t for t in results if isinstance(t, torch.Tensor)]
        if touched and all(t.dtype == torch.int64 and t.numel() == 1 for t in touched):
            return out  # the generator's own state (the docstring)
        self.ops.append((func, [(str(t.device), t.is_cuda) for t in flat],
                         torch.device(kwargs["device"]).type if "device" in kwargs else None,
                         [(str(t.device), t.is_cuda) for t in results if isinstance(t, torch.Tensor)]))
        return out

    def first(self, func):
        return next(op[1:] for op in self.ops if op[0] is func)


def test_a_users_dispatch_mode_sees_device_tensors_on_the_device(cuda_kind):
    x = torch.ones(4, device="cuda")
    with _Seen() as seen:
        y = x + 1
        torch.zeros(2, device="cuda")
        y.cpu()
        torch.ones(3) * 2
    assert seen.first(aten.add.Tensor) == ([("cuda:0", True)], None, [("cuda:0", True)])
    assert seen.first(aten.zeros.default) == ([], "cuda", [("cuda:0", True)])
    assert seen.first(aten._to_copy.default) == ([("cuda:0", True)], "cpu", [("cpu", False)])
    assert seen.first(aten.mul.Tensor) == ([("cpu", False)], None, [("cpu", False)])
    assert y.is_cuda and y.tolist() == [2.0] * 4


def test_a_users_dispatch_mode_sees_each_tensor_on_its_own_device(two_devices):
    a = torch.ones(2, device="cuda:1")
    with _Seen() as seen:
        b = a * 3
        torch.empty(2, device="cuda:1")
    assert seen.first(aten.mul.Tensor) == ([("cuda:1", True)], None, [("cuda:1", True)])
    assert seen.first(aten.empty.memory_format) == ([], "cuda", [("cuda:1", True)])
    assert b.device == torch.device("cuda", 1)


def test_the_capture_input_liveness_check_finds_a_freed_input(cuda_kind):
    """torch 2.14's `check_input_liveness=True` tracks a capture's inputs with a dispatch mode
    that keeps CUDA tensors only: it found none on the emulated device, so the freed input was
    reported by the harness's own check, not by torch's."""
    graph = torch.cuda.CUDAGraph()
    if "check_input_liveness" not in torch.cuda.graph.__init__.__code__.co_varnames:
        pytest.skip(f"torch {torch.__version__} has no check_input_liveness")
    x = torch.ones(4, device="cuda")
    with torch.cuda.graph(graph, check_input_liveness=True):
        y = x * 2
    graph.replay()
    assert y.tolist() == [2.0] * 4
    del x
    gc.collect()
    with pytest.raises(RuntimeError, match=r"CUDA graph replay detected 1 dead tensor\(s\)"):
        graph.replay()



def test_modes_entered_before_a_capture_see_the_captured_ops_and_a_replay_none(cuda_kind):
    """A capture is no dispatch mode on CUDA: modes entered before it see each captured op as
    issued, on the device, and a replay is one launch that reaches no mode. The emulated
    capture's recorder went on torch's stack above them, so they saw its bookkeeping (a meta
    shape inference, pool allocations, `set_`, a poison `fill_`, `equal`) instead of the
    captured op; and a replay where no stream tracking ran it apart reached them op by op."""
    x = torch.ones(4, device="cuda")
    torch.cuda.synchronize()
    with _Seen() as outer, _Seen() as inner:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = x * 2
    for seen in (outer, inner):
        assert [op[0] for op in seen.ops] == [aten.mul.Tensor]
        assert seen.first(aten.mul.Tensor) == ([("cuda:0", True)], None, [("cuda:0", True)])
    x.fill_(3.0)
    with _Seen() as seen:
        graph.replay()
    assert seen.ops == []
    torch.cuda.synchronize()
    assert y.tolist() == [6.0] * 4


def test_a_replay_reaches_no_mode_where_races_are_not_tracked(outside_emulation):
    """Without stream tracking (`races="off"`, issue order) the emulated device ran a replay's
    recorded ops in the caller's dispatch modes."""
    with harness.emulate_cuda(device="cpu", races="off"):
        x = torch.ones(4, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = (x + 1).sum()
        with _Seen() as seen:
            graph.replay()
        assert seen.ops == [] and y.item() == 8.0
