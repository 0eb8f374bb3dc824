"""A transducer's greedy decoding loop runs its prediction network (an LSTM) under bfloat16
autocast and writes the new hidden state of the rows that emitted a label back into float32 state
buffers by index. On CUDA the LSTM goes to cuDNN, whose autocast kernel casts it to float16 whatever
the autocast dtype, so the write-back raises "Index put requires the source and destination
dtypes match, got Float for the destination and Half for the source." (RETURNN #1529: an LSTM under
`torch_amp="bfloat16"` came back float16 beside a float32 LayerNorm, "also happens with pure
pytorch"; Casanovo #508, fixed by PR #593: decoder outputs under mixed precision assigned into a
float32 tensor by index). The emulated device ran the CPU's LSTM uncast and wrote float32 states
without error. Fixed: the state cast to the buffer's dtype before the write."""

from __future__ import annotations

import pytest
import torch

RUNS_NATIVELY_ON_A_GPU = True

DTYPES_DIFFER = ("Index put requires the source and destination dtypes match, got Float for the "
                 "destination and Half for the source")


class Predictor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(12, 6)
        self.norm = torch.nn.LayerNorm(6)
        self.rnn = torch.nn.LSTM(6, 8)


def decode(*, cast_back: bool, steps: int = 3) -> torch.Tensor:
    predictor = Predictor().cuda()
    batch = 4
    h = torch.zeros(1, batch, 8, device="cuda")
    c = torch.zeros(1, batch, 8, device="cuda")
    labels = torch.tensor([1, 2, 3, 4], device="cuda")
    for step in range(steps):
        emitted = (torch.arange(batch, device="cuda") + step) % 2 == 0
        with torch.autocast("cuda", dtype=torch.bfloat16):
            x = predictor.norm(predictor.embed(labels))[None]
            _, (new_h, new_c) = predictor.rnn(x, (h, c))
        if cast_back:
            new_h, new_c = new_h.to(h.dtype), new_c.to(c.dtype)
        h[:, emitted] = new_h[:, emitted]
        c[:, emitted] = new_c[:, emitted]
        labels = (labels + 1) % 12
    return h


def test_the_state_written_back_in_the_lstms_dtype_is_refused():
    with pytest.raises(RuntimeError, match=DTYPES_DIFFER):
        decode(cast_back=False)


def test_the_state_cast_to_the_buffers_dtype_decodes():
    h = decode(cast_back=True)
    assert h.dtype == torch.float32 and h.is_cuda
    assert bool(torch.isfinite(h).all()) and bool((h != 0).any())
