"""What the stream tracking keeps per op instead of asking torch at every call gives the answer the
call itself would: a queued op's result shapes per argument metadata (strides and scalar kinds
apart), results of torch's named-tuple kinds kept whole, and each op's plan from its schema."""

from __future__ import annotations

import torch

from harness.graphs.emulator.shapes import result_shapes
from harness.emulation.tracking.op_plans import OpPlans
from harness.emulation.tracking.queued_shapes import ResultShapes, flat_tensors, map_tensors

aten = torch.ops.aten


def _layout(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.dtype


def test_result_shapes_are_kept_apart_by_stride():
    shapes = ResultShapes()
    contiguous = torch.ones(3, 2)
    transposed = torch.ones(2, 3).t()  # the same shape and dtype, other strides
    first = shapes.of(aten.mul.Tensor, (contiguous, contiguous), {})
    second = shapes.of(aten.mul.Tensor, (transposed, transposed), {})
    assert _layout(first) == _layout(result_shapes(aten.mul.Tensor, (contiguous, contiguous), {}))
    assert _layout(second) == _layout(result_shapes(aten.mul.Tensor, (transposed, transposed), {}))
    assert second.stride() == (1, 3) and first.stride() == (2, 1)


def test_result_shapes_are_kept_apart_by_scalar_kind():
    shapes = ResultShapes()
    ints = torch.ones(4, dtype=torch.int64)
    assert shapes.of(aten.mul.Scalar, (ints, 1), {}).dtype == torch.int64
    assert shapes.of(aten.mul.Scalar, (ints, 1.0), {}).dtype == torch.float32  # 1 == 1.0 in a dict
    assert shapes.of(aten.mul.Scalar, (ints, True), {}).dtype == torch.int64


def test_result_shapes_with_keyword_arguments_and_a_repeat_call():
    shapes = ResultShapes()
    x = torch.ones(2, 5)
    kwargs = {"dim": [1], "keepdim": True}
    once = shapes.of(aten.sum.dim_IntList, (x,), kwargs)
    again = shapes.of(aten.sum.dim_IntList, (x,), {"dim": [1], "keepdim": False})
    assert tuple(once.shape) == (2, 1) and tuple(again.shape) == (2,)
    assert shapes.of(aten.sum.dim_IntList, (x,), kwargs) is once  # kept, not run again


def test_named_tuple_results_keep_their_kind():
    result = torch.max(torch.tensor([[1.0, 3.0], [2.0, 0.0]]), 0)
    doubled = map_tensors(lambda t: t * 2, result)
    assert type(doubled) is type(result)
    assert torch.equal(doubled.values, torch.tensor([4.0, 6.0]))
    assert [t.dtype for t in flat_tensors(result)] == [torch.float32, torch.int64]


def test_plain_arguments_are_mapped_in_place_of_their_tensors():
    x = torch.zeros(2)
    mapped = map_tensors(lambda t: t + 1, ((x, [x, 3], None), {"out": x, "alpha": 2}))
    (first, (second, three), none), kwargs = mapped
    assert torch.equal(first, torch.ones(2)) and torch.equal(second, torch.ones(2))
    assert (three, none, kwargs["alpha"]) == (3, None, 2)
    assert torch.equal(kwargs["out"], torch.ones(2))


def test_op_plans_follow_the_schema():
    plans = OpPlans()
    add_ = plans.get(aten.add_.Tensor)
    assert plans.get(aten.add_.Tensor) is add_
    assert add_.written == frozenset({"self"}) and add_.deferrable and not add_.may_block_host
    assert not plans.get(aten.normal_.default).deferrable  # takes the generator's offset
    assert plans.get(aten.nonzero.default).may_block_host  # its shape needs the data
    assert plans.get(aten.copy_.default).may_block_host  # a copy from or to the host may block
    assert plans.get(aten.reshape.default).composite
    assert plans.get(aten.mul.Tensor).written == frozenset()


def test_the_current_stream_key_kept_per_thread_follows_the_stream_made_current():
    """The tracking asks the current stream's key at every op; the device keeps it per thread
    and device until another stream is made current, so each of those changes must show."""
    import threading

    import harness
    from harness.emulation.tracking.observer import stream_key

    with harness.emulate_cuda(device="cpu", device_count=2) as state:
        key = state.streams.current_key
        default = key()
        assert default == stream_key(torch.cuda.current_stream())
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            assert key() == stream_key(side) != default
        assert key() == default
        with torch.cuda.device(1):
            on_one = key()
            assert on_one == stream_key(torch.cuda.current_stream()) != default
        torch.cuda.set_stream(side)
        seen = []
        thread = threading.Thread(target=lambda: seen.append(key()))
        thread.start()
        thread.join()
        assert seen == [default], "a new thread starts on the default stream of device 0"
        assert key() == stream_key(side)
        torch.cuda.set_stream(torch.cuda.default_stream())
        assert key() == default
