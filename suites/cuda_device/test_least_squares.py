"""`torch.linalg.lstsq` of device tensors takes CUDA's only driver, `gels`
(BatchLinearAlgebra.cpp's `get_default_lstsq_driver`): its default on CUDA, where the CPU's is
`gelsy`, and any other name refused with "torch.linalg.lstsq: `driver` other than `gels` is not
supported on CUDA" (before the name's own check, as PyTorch's test_linalg expects of a made-up
name). The emulated device ran the CPU's `gelsy` and took every driver: `rank` was filled and
`residuals` empty where CUDA leaves `rank` and `singular_values` empty and fills `residuals` for a
tall matrix, and a model merging code calling `driver="gelsd"` ran here and raised on every GPU.
The `cuda_kind` rows show CUDA's own answers on a GPU."""

from __future__ import annotations

import pytest
import torch

NOT_ON_CUDA = "torch.linalg.lstsq: `driver` other than `gels` is not supported on CUDA"


def _system() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(6, 3, generator=generator), torch.randn(6, 2, generator=generator)


def test_the_default_driver_is_gels_with_its_fields(cuda_kind):
    a, b = _system()
    answer = torch.linalg.lstsq(a.to("cuda"), b.to("cuda"))
    assert answer.rank.numel() == 0 and answer.singular_values.numel() == 0
    assert answer.solution.is_cuda and answer.residuals.shape == (2,)
    expected = torch.linalg.lstsq(a, b, driver="gelsd").solution
    assert torch.allclose(answer.solution.cpu(), expected, atol=1e-5)
    residuals = (a @ expected - b).pow(2).sum(0)
    assert torch.allclose(answer.residuals.cpu(), residuals, atol=1e-4)


@pytest.mark.parametrize("driver", ["gelsy", "gelsd", "gelss", "fictitious_driver"])
def test_another_driver_is_refused_in_cudas_words(cuda_kind, driver):
    a, b = _system()
    with pytest.raises(RuntimeError, match=f"^{NOT_ON_CUDA}"):
        torch.linalg.lstsq(a.to("cuda"), b.to("cuda"), driver=driver)


def test_host_tensors_keep_the_cpus_gelsy(cuda_kind):
    a, b = _system()
    answer = torch.linalg.lstsq(a, b)
    assert answer.rank.item() == 3 and answer.residuals.numel() == 0
    assert torch.linalg.lstsq(a, b, driver="gelsd").singular_values.shape == (3,)
