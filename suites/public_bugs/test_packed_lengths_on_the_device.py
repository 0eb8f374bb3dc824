"""An RNN encoder packs its padded batch with `pack_padded_sequence(embedded, lengths)` where the
lengths were counted on the device from the padding mask. CUDA wants them on the host and refuses
"'lengths' argument should be a 1D CPU int64 tensor, but got 1D cuda:0 Long tensor" (PyTorch #43227,
by design: the lengths drive host-side loops; fairseq #3557 and many tutorials hit it). The emulated
device ran the device form, and refused the fixed one as mixing devices, since a packed sequence
holds device data beside host batch sizes. Fixed: `lengths.cpu()`; the LSTM runs over the packed
batch and `pad_packed_sequence` gives back device outputs and host lengths."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

LENGTHS_ON_THE_HOST = "'lengths' argument should be a 1D CPU int64 tensor, but got 1D cuda:0 Long tensor"


class Encoder(torch.nn.Module):
    def __init__(self, *, lengths_to_host: bool):
        super().__init__()
        self.lengths_to_host = lengths_to_host
        self.embed = torch.nn.Embedding(10, 4, padding_idx=0)
        self.rnn = torch.nn.LSTM(4, 6, batch_first=True)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = (tokens != 0).sum(1)
        if self.lengths_to_host:
            lengths = lengths.cpu()
        packed = pack_padded_sequence(self.embed(tokens), lengths, batch_first=True,
                                      enforce_sorted=False)
        outputs, _ = self.rnn(packed)
        return pad_packed_sequence(outputs, batch_first=True)


TOKENS = torch.tensor([[3, 4, 5, 0], [6, 7, 0, 0], [8, 9, 1, 2]])


def _encoder(lengths_to_host: bool) -> Encoder:
    torch.manual_seed(0)
    return Encoder(lengths_to_host=lengths_to_host)


def test_lengths_counted_on_the_device_are_refused_in_cudas_words():
    encoder = _encoder(lengths_to_host=False).to("cuda")
    with pytest.raises(RuntimeError, match=f"^{LENGTHS_ON_THE_HOST}"):
        encoder(TOKENS.to("cuda"))


def test_host_lengths_pack_and_pad_as_on_the_host():
    expected, expected_lengths = _encoder(lengths_to_host=True)(TOKENS)
    outputs, lengths = _encoder(lengths_to_host=True).to("cuda")(TOKENS.to("cuda"))
    assert outputs.is_cuda and lengths.device.type == "cpu"
    assert lengths.tolist() == expected_lengths.tolist() == [3, 2, 4]
    assert torch.allclose(outputs.cpu(), expected, atol=1e-3)  # cuDNN may run the LSTM in TF32
