"""torch.fft's transforms in float16: CUDA computes them with cuFFT (complex32 out of a forward or
complex transform, float16 out of a complex-to-real one) where every signal size is a power of
two, and refuses other sizes; the CPU refuses half altogether. Expected dtypes: the op database's
fft rows on an H100 (torch 2.11)."""

from __future__ import annotations

import pytest
import torch

FORWARD = ["fft", "ifft", "rfft", "ihfft", "fft2", "ifft2", "rfft2", "ihfft2", "fftn", "ifftn",
           "rfftn", "ihfftn"]
TO_REAL = ["irfft", "hfft", "irfft2", "hfft2", "irfftn", "hfftn"]


@pytest.mark.parametrize("name", FORWARD + TO_REAL)
def test_a_half_transform_of_power_of_two_sizes_runs_in_cudas_dtype(cuda_kind, name):
    # a complex-to-real transform's last signal size is 2 * (m - 1): 8 for m = 5
    x = torch.randn(4, 5 if name in TO_REAL else 8, device="cuda")
    out = getattr(torch.fft, name)(x.half())
    assert out.is_cuda
    assert out.dtype == (torch.float16 if name in TO_REAL else torch.complex32)
    expected = getattr(torch.fft, name)(x.half().float())
    torch.testing.assert_close(out.to(expected.dtype).cpu(), expected.cpu(), atol=0.05, rtol=0.02)


@pytest.mark.parametrize("name,size,signal", [("fft", 6, "[6]"), ("irfft", 6, "[10]"),
                                              ("rfft2", 6, "[4, 6]")])
def test_other_sizes_are_refused_as_cufft_refuses_them(cuda_kind, name, size, signal):
    x = torch.randn(4, size, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match=r"cuFFT only supports dimensions whose sizes are powers "
                       r"of two when computing in half precision, but got a signal size of"
                       + signal.replace("[", r"\[").replace("]", r"\]")):
        getattr(torch.fft, name)(x)


def test_padding_to_a_power_of_two_and_autocast_leave_the_dtype(cuda_kind):
    x = torch.randn(6, device="cuda", dtype=torch.float16)
    assert torch.fft.fft(x, n=8).shape == (8,)
    with torch.autocast("cuda", dtype=torch.bfloat16):  # fft is on no autocast list
        assert torch.fft.rfft(torch.randn(8, device="cuda").half()).dtype == torch.complex32
    with pytest.raises(RuntimeError, match="Unsupported dtype BFloat16"):
        torch.fft.fft(x.bfloat16())
