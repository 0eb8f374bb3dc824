"""Host reads hidden in a captured decode step, beyond `.item()`: `.tolist()` of the sequence
lengths to build a Python loop, `nonzero()` to find the rows that finished, and boolean-mask
indexing to gather the live rows (vLLM #48749, PyTorch #196133; TensorRT-LLM #17110 builds its
write positions from `seq_lens.tolist()`). Each needs the device's data on the host: CUDA refuses
it during capture (a pageable copy, or a sync of the capturing stream). The harness names the op
and the user's line. Fixed: device-side forms with shapes known before capture (`torch.where`,
a multiply by the mask)."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import CaptureError

from suites.public_bugs._refusals import stream_kept


def _tolist(seq_lens: torch.Tensor, out: torch.Tensor) -> None:
    for row, length in enumerate(seq_lens.tolist()):
        out[row] = length


def _nonzero(seq_lens: torch.Tensor, out: torch.Tensor) -> None:
    out.zero_()
    out.index_fill_(0, (seq_lens == 0).nonzero().flatten(), 1)


def _mask(seq_lens: torch.Tensor, out: torch.Tensor) -> None:
    out[:1].copy_(seq_lens[seq_lens > 0].sum())


def _device_side(seq_lens: torch.Tensor, out: torch.Tensor) -> None:
    live = seq_lens > 0
    out.copy_(torch.where(live, seq_lens, torch.zeros_like(seq_lens)) + (~live).long())


@pytest.mark.parametrize("step,op", [(_tolist, "tolist"), (_nonzero, "nonzero"),
                                     (_mask, "nonzero")], ids=["tolist", "nonzero", "mask"])
def test_a_host_read_inside_the_capture_is_refused(step, op):
    seq_lens = torch.tensor([3, 0, 2, 5], device="cuda")
    out = torch.zeros(4, dtype=torch.long, device="cuda")
    step(seq_lens, out)  # warmup, eager: fine outside a capture
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with stream_kept(), pytest.raises((CaptureError, RuntimeError)) as caught:
        with torch.cuda.graph(graph):
            step(seq_lens, out)
    message = str(caught.value)
    assert "test_host_reads_in_capture.py" in message  # the user's line
    assert op in message or "copy" in message.lower()


def test_the_device_side_step_captures_and_follows_new_lengths():
    seq_lens = torch.tensor([3, 0, 2, 5], device="cuda")
    out = torch.zeros(4, dtype=torch.long, device="cuda")
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        _device_side(seq_lens, out)
    seq_lens.copy_(torch.tensor([0, 4, 0, 1]))
    graph.replay()
    assert out.tolist() == [1, 4, 1, 1]
