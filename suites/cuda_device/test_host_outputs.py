"""Outputs CUDA makes in host memory from a device call: a packed sequence's batch sizes
(`_pack_padded_sequence` makes them with its host lengths' options) and the lengths padding one
returns (`_pad_packed_sequence`, with the host batch sizes' options). The emulated device marked
them device memory wherever something marked a device call's results: the stream tracking's
dispatch (a stream made earlier turns it on), the view a user's dispatch mode gets, activation
checkpointing's modes and pack hook; the placement mode then copied them back to the host. So
each pack and pad counted a device block CUDA never allocates, a user's mode saw them on cuda:0,
and the adversarial schedule queued the pack as a kernel, which it cannot shape. The `cuda_kind`
rows show CUDA's own answers on a GPU."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.utils.checkpoint import checkpoint

from fixtures.emulated_device import own_emulated_device
from harness import torch_internals
from harness.torch_internals import TorchDispatchMode

ROUNDS = 3


def _pack_and_pad(steps: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    packed = pack_padded_sequence(steps, lengths)
    assert packed.batch_sizes.device.type == "cpu"
    return pad_packed_sequence(packed)


@pytest.mark.parametrize("streams_made", [False, True], ids=["no_stream", "a_stream_made"])
@pytest.mark.parametrize("how", ["eager", "inference_mode", "checkpointed"])
def test_packing_and_padding_allocate_only_their_device_outputs(cuda_kind, streams_made, how):
    """Each round allocates two device blocks, the packed data and the padded output: the batch
    sizes and the lengths are host memory, made by no device allocation, under every mode."""
    if streams_made:
        torch.cuda.Stream()
    # checkpointed: its modes meet the ops of a region that needs grad
    steps = torch.randn(3, 2, 4, device="cuda", requires_grad=how == "checkpointed")
    lengths = torch.tensor([3, 2])
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    for _ in range(ROUNDS):
        if how == "inference_mode":
            with torch.inference_mode():  # the pad reaches the dispatch modes whole
                padded, padded_lengths = _pack_and_pad(steps, lengths)
        elif how == "checkpointed":
            padded, padded_lengths = checkpoint(_pack_and_pad, steps, lengths, use_reentrant=False)
        else:
            padded, padded_lengths = _pack_and_pad(steps, lengths)
        assert padded.is_cuda and padded_lengths.device.type == "cpu"
        assert padded_lengths.tolist() == [3, 2]
        del padded, padded_lengths
    assert torch.cuda.memory_stats()["allocation.all.allocated"] - before == 2 * ROUNDS


def test_the_aten_ops_called_directly_keep_their_host_outputs(cuda_kind):
    """`torch.ops.aten._pack_padded_sequence` is the op `pack_padded_sequence` calls through
    torch._VF: host lengths beside device data are its inputs, host batch sizes its output."""
    steps = torch.randn(3, 2, 4, device="cuda")
    data, batch_sizes = torch.ops.aten._pack_padded_sequence(steps, torch.tensor([3, 2]), False)
    assert data.is_cuda and batch_sizes.device.type == "cpu" and batch_sizes.tolist() == [2, 2, 1]
    padded, lengths = torch.ops.aten._pad_packed_sequence.default(data, batch_sizes, False, 0.0, 3)
    assert padded.is_cuda and lengths.device.type == "cpu" and lengths.tolist() == [3, 2]
    expected = steps.cpu()
    expected[2, 1] = 0.0  # the shorter sequence's step past its length: the padding value
    assert torch.equal(padded.cpu(), expected)
    with pytest.raises(RuntimeError, match="^'lengths' argument should be a 1D CPU int64 tensor, "
                                           "but got 1D cuda:0 Long tensor"):
        torch.ops.aten._pack_padded_sequence.default(steps, torch.tensor([3, 2], device="cuda"),
                                                     False)


class _FactoryDevices(TorchDispatchMode):
    """Where the ops it sees put their results: the packing op's outputs, each factory's."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, tuple[str, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in ("_pack_padded_sequence", "full", "empty"):
            outs = out if isinstance(out, tuple) else (out,)
            self.seen.append((name, tuple(o.device.type for o in outs)))
        return out


def test_a_users_dispatch_mode_sees_the_host_outputs_on_the_host(cuda_kind):
    steps = torch.randn(3, 2, 4, device="cuda")
    with _FactoryDevices() as mode:
        _pack_and_pad(steps, torch.tensor([3, 2]))
    # the pad decomposes below autograd: its output by `full`, its lengths by `empty`
    assert mode.seen == [("_pack_padded_sequence", ("cuda", "cpu")), ("full", ("cuda",)),
                         ("empty", ("cpu",))]


def test_the_adversarial_schedule_packs_behind_queued_work():
    """The pack runs at issue, after its stream's queued work: its batch sizes are on the host
    when it returns (no kernel makes them), and its data reads the queued result."""
    with own_emulated_device(schedule="adversarial"):
        side = torch.cuda.Stream()
        steps = torch.arange(6.0, device="cuda").view(3, 2, 1)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            doubled = steps * 2  # queued on the side stream
            packed = pack_padded_sequence(doubled, torch.tensor([3, 2]))
            assert packed.batch_sizes.device.type == "cpu"
            assert packed.batch_sizes.tolist() == [2, 2, 1]
        torch.cuda.current_stream().wait_stream(side)
        assert packed.data.flatten().tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]


def test_pads_host_lengths_come_from_its_one_empty():
    """The emulated device tells the pad's host lengths by the factory its kernel makes them with
    (`empty`; its output comes from `full`): this torch's kernel must still make them so."""
    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.factories: list[tuple[str, torch.dtype]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket.__name__ in ("empty", "full", "new_full", "new_empty", "zeros"):
                self.factories.append((str(func), out.dtype))
            return out

    data, batch_sizes = torch_internals.pack_padded_sequence_call(torch.randn(3, 2, 4),
                                                                  torch.tensor([3, 2]), False)
    with Ops() as ops:
        torch_internals.pad_packed_sequence_call(data, batch_sizes, False, 0.0, 3)
    assert ops.factories == [("aten.full.default", torch.float32),
                             ("aten.empty.memory_format", torch.int64)]
