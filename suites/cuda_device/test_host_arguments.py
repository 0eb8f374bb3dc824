"""Calls whose tensor argument CUDA wants in host memory: `torch.tensor_split(x, t)` of a tensor of
sections or indices, `torch.randint_like(x, high)` of a tensor bound and `pack_padded_sequence`'s
lengths check the argument's device before reading it (TensorShape.cpp, TensorFactories.cpp,
PackedSequence.cpp) and refuse a device tensor. The emulated device's tensors passed those checks
and the calls ran. A host argument, the form CUDA asks for, splits and draws on the device, and
packs device data with host batch sizes, which the emulated device refused as mixing devices (and
an LSTM over the packed input, and padding it back). The `cuda_kind` rows show CUDA's own answers
on a GPU."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

REFUSED = {
    "torch.tensor_split": (lambda x, t: torch.tensor_split(x, t),
                           "tensor_split expected tensor_indices_or_sections to be on cpu, but it's on cuda:0"),
    "Tensor.tensor_split of indices": (lambda x, t: x.tensor_split(torch.stack((t, t + 2))),
                                       "tensor_split expected tensor_indices_or_sections to be on cpu, but it's on cuda:0"),
    "torch.randint_like": (lambda x, t: torch.randint_like(x, t), "high must be a scalar tensor and on CPU"),
    "pack_padded_sequence": (lambda x, t: pack_padded_sequence(x.view(4, 2, 1), torch.stack((t + 2, t))),
                             "'lengths' argument should be a 1D CPU int64 tensor, but got 1D cuda:0 Long tensor"),
    # the aten ops called themselves (until 2026-12-08 they split and drew)
    "aten.tensor_split.tensor_indices_or_sections": (
        lambda x, t: torch.ops.aten.tensor_split.tensor_indices_or_sections(x, t),
        "tensor_split expected tensor_indices_or_sections to be on cpu, but it's on cuda:0"),
    "aten.tensor_split packet": (lambda x, t: torch.ops.aten.tensor_split(x, t),
                                 "tensor_split expected tensor_indices_or_sections to be on cpu, but it's on cuda:0"),
    "aten.randint_like.Tensor": (lambda x, t: torch.ops.aten.randint_like.Tensor(x, t),
                                 "high must be a scalar tensor and on CPU"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_device_argument_is_refused_in_cudas_words(cuda_kind, name):
    call, text = REFUSED[name]
    x = torch.arange(8.0, device="cuda")
    with pytest.raises(RuntimeError, match=f"^{text}"):
        call(x, torch.tensor(2, device="cuda"))


def test_a_host_argument_splits_and_draws_on_the_device(cuda_kind):
    x = torch.arange(8.0, device="cuda")
    pieces = torch.tensor_split(x, torch.tensor(2))
    assert [p.tolist() for p in pieces] == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
    assert all(p.is_cuda for p in pieces)
    assert [p.tolist() for p in x.tensor_split(torch.tensor([3, 5]))] == [[0.0, 1.0, 2.0], [3.0, 4.0],
                                                                           [5.0, 6.0, 7.0]]
    drawn = torch.randint_like(x, torch.tensor(5))
    assert drawn.is_cuda and 0 <= drawn.min().item() and drawn.max().item() < 5


@pytest.mark.parametrize("streams_made", [False, True], ids=["no_stream", "a_stream_made"])
def test_a_packed_sequence_keeps_host_batch_sizes_through_an_lstm(cuda_kind, streams_made):
    """A stream made first turns the emulated device's stream tracking on, whose dispatch marks
    every output of a device call device memory: the batch sizes must stay host memory there too."""
    if streams_made:
        torch.cuda.Stream()
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 5)
    steps = torch.randn(3, 2, 4)
    lengths = torch.tensor([3, 2])
    expected = pad_packed_sequence(lstm(pack_padded_sequence(steps, lengths))[0])[0]
    lstm.to("cuda")
    packed = pack_padded_sequence(steps.to("cuda"), lengths)
    assert packed.data.is_cuda and packed.batch_sizes.device.type == "cpu"
    padded, padded_lengths = pad_packed_sequence(lstm(packed)[0])
    assert padded.is_cuda and padded_lengths.device.type == "cpu"
    assert padded_lengths.tolist() == [3, 2]
    assert torch.allclose(padded.cpu(), expected, atol=1e-3)  # cuDNN may run the LSTM in TF32
