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
from harness.emulation.graph_rng_holders import PAIR_AT_FIRST_DRAW, PAIR_PER_STATE
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


class _Recorded(TorchDispatchMode):
    """Runs each op, then notes it in `ops` (`_note`, None: not noted)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        results = out if isinstance(out, (tuple, list)) else (out,)
        noted = self._note(func, [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)],
                           kwargs, [t for t in results if isinstance(t, torch.Tensor)])
        if noted is not None:
            self.ops.append(noted)
        return out


class _Seen(_Recorded):
    """Per op: the devices of its tensor arguments, the type of its `device=` argument (CUDA may
    hand on "cuda" without an index), its results' devices. Ops on one-element int64 tensors
    alone are left out: CUDA's generator makes and fills two such tensors of its own around a
    capture and a replay through the dispatcher (the generator holders' tests below)."""

    @staticmethod
    def _note(func, tensors, kwargs, results):
        touched = tensors + results
        if touched and all(t.dtype == torch.int64 and t.numel() == 1 for t in touched):
            return None  # the generator's own state (the docstring)
        return (func, [(str(t.device), t.is_cuda) for t in tensors],
                torch.device(kwargs["device"]).type if "device" in kwargs else None,
                [(str(t.device), t.is_cuda) for t in results])

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


class _Ops(_Recorded):
    """Per op: its name, its tensor arguments' and results' (device, dtype, shape)."""

    @staticmethod
    def _note(func, tensors, kwargs, results):
        return (str(func), _described(tensors), _described(results))


def _described(tensors) -> list:
    return [(str(t.device), str(t.dtype), tuple(t.shape)) for t in tensors]


_HOLDER = [("cuda:0", "torch.int64", (1,))]
_MADE = [("aten.empty.memory_format", [], _HOLDER)] * 2
_FILLED = [("aten.fill_.Scalar", _HOLDER, _HOLDER)] * 2
_X = [("cuda:0", "torch.float32", (4,))]


def _at_capture_begin(first_graph: bool) -> list:
    """What a mode sees CUDA's generator do at capture_begin: up to torch 2.11 the default
    generator's state makes its seed and offset holders when it registers its first live graph
    and fills them at each capture (CUDAGeneratorState::register_graph, capture_prologue); torch
    2.12-2.13 make a pair per capture (init_capture_state); from 2.14 the pair is made at the
    first draw, inside the random kernel, where no mode is on the stack."""
    if PAIR_AT_FIRST_DRAW:
        return []
    if not PAIR_PER_STATE:
        return _MADE
    return (_MADE if first_graph else []) + _FILLED


def test_a_mode_around_a_capture_sees_the_generator_holders_made_and_filled(cuda_kind):
    """Measured on an H100 (torch 2.11): two `empty` and two `fill_` of one-element int64
    tensors at the first capture, two `fill_` at a capture while another graph lives, before
    the captured ops. The emulated device showed none."""
    x = torch.ones(4, device="cuda")
    torch.cuda.synchronize()
    gc.collect()  # graphs of earlier tests go (natively they would keep the holders)
    with _Ops() as first:
        g1 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g1):
            x * 2
    mul = [("aten.mul.Tensor", _X, _X)]
    if cuda_kind == "emulated":  # a fresh device: no graph lived before
        assert first.ops == _at_capture_begin(True) + mul
    else:  # natively a graph an earlier test keeps may hold them already
        assert first.ops in (_at_capture_begin(True) + mul, _at_capture_begin(False) + mul)
    with _Ops() as second:
        g2 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g2):
            x * 2
    assert second.ops == _at_capture_begin(False) + mul
    with _Ops() as seen:
        g1.replay()
    assert seen.ops == []  # a graph that drew nothing: no holder is filled
    del g1, g2


def test_each_replay_of_a_graph_that_drew_fills_the_generator_holders(cuda_kind):
    """CUDAGraph::replay fills the seed and offset holders of each generator state the graph
    drew from before it launches (replay_prologue, every build; measured on an H100, torch
    2.11): a mode on the stack sees two `fill_`, the launch itself nothing."""
    x = torch.ones(4, device="cuda")
    anchor = torch.cuda.CUDAGraph()
    with torch.cuda.graph(anchor):
        x * 2
    torch.cuda.synchronize()
    with _Ops() as outer, _Ops() as inner:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            r = torch.rand(4, device="cuda") + x
    drawn = [("aten.rand.default", [], _X), ("aten.add.Tensor", _X + _X, _X)]
    assert outer.ops == inner.ops == _at_capture_begin(False) + drawn
    for _ in range(2):
        with _Ops() as seen:
            graph.replay()
        assert seen.ops == _FILLED
    torch.cuda.synchronize()
    assert r.shape == (4,) and bool(((r > 1) & (r < 2)).all())
    del anchor
