"""`torch.cuda.tunable` (TunableOp) on the emulated device: its settings, as CUDA keeps them.

TunableOp picks among CUDA's GEMM kernels by timing them. A CPU build has none of its
`torch._C._cuda_tunableop_*` functions, so a runtime that sets TunableOp up at start-up failed
inside the emulation with an AttributeError. The emulated device keeps every setting and answers
with CUDA's defaults (measured on an H100, torch 2.11: off, tuning on once enabled, untuned
recording off, 30 ms, 100 iterations, no file name, no results, the PyTorch version as the one
validator). It runs the CPU's GEMM kernels, so there is nothing to tune: `get_results()` stays
empty whatever the settings, and reading a results file is refused by name, since its entries
name CUDA kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice


@dataclass
class TunableOps:
    """TunableOp's settings for the emulation's duration (c10's TuningContext)."""

    enabled: bool = False
    tuning: bool = True
    record_untuned: bool = False
    max_tuning_duration_ms: int = 30
    max_tuning_iterations: int = 100
    filename: str = ""
    rotating_buffer_size: int = 0
    numerical_check: tuple[bool, float, float] = (False, 1e-5, 1e-5)

    # --- torch._C's names, as torch.cuda.tunable calls them --------------------------------------

    def enable(self, value: bool = True) -> None:
        self.enabled = bool(value)

    def is_enabled(self) -> bool:
        return self.enabled

    def tuning_enable(self, value: bool = True) -> None:
        self.tuning = bool(value)

    def tuning_is_enabled(self) -> bool:
        return self.tuning

    def record_untuned_enable(self, value: bool = True) -> None:
        self.record_untuned = bool(value)

    def record_untuned_is_enabled(self) -> bool:
        return self.record_untuned

    def set_max_tuning_duration(self, duration: int) -> None:
        self.max_tuning_duration_ms = int(duration)

    def get_max_tuning_duration(self) -> int:
        return self.max_tuning_duration_ms

    def set_max_tuning_iterations(self, iterations: int) -> None:
        self.max_tuning_iterations = int(iterations)

    def get_max_tuning_iterations(self) -> int:
        return self.max_tuning_iterations

    def set_filename(self, filename: str, insert_device_ordinal: bool = False) -> None:
        if insert_device_ordinal:
            stem, dot, suffix = filename.rpartition(".")
            ordinal = torch.cuda.current_device()
            filename = f"{stem}{ordinal}.{suffix}" if dot else f"{filename}{ordinal}"
        self.filename = filename

    def get_filename(self) -> str:
        return self.filename

    def get_results(self) -> tuple:
        return ()

    def get_validators(self) -> tuple:
        return (("PT_VERSION", torch.__version__.split("+")[0]),)

    def read_file(self, filename: str) -> bool:
        raise UnsupportedOnEmulatedDevice(
            f"torch.cuda.tunable.read_file({filename!r}): TunableOp's results name CUDA GEMM "
            f"kernels, and the emulated CUDA device runs the CPU's; run it on a GPU, or leave the "
            f"results file out of the emulated run")

    def set_rotating_buffer_size(self, size: int) -> None:
        self.rotating_buffer_size = int(size)

    def get_rotating_buffer_size(self) -> int:
        return self.rotating_buffer_size

    def set_numerical_check_tolerances(self, enable: bool, atol: float = 1e-5,
                                       rtol: float = 1e-5) -> None:
        self.numerical_check = (bool(enable), float(atol), float(rtol))


# torch._C name -> TunableOps method: the rows cuda_api.py puts in its table.
PRIVATE_NAMES = {
    "_cuda_tunableop_enable": "enable",
    "_cuda_tunableop_is_enabled": "is_enabled",
    "_cuda_tunableop_tuning_enable": "tuning_enable",
    "_cuda_tunableop_tuning_is_enabled": "tuning_is_enabled",
    "_cuda_record_untuned_enable": "record_untuned_enable",
    "_cuda_record_untuned_is_enabled": "record_untuned_is_enabled",
    "_cuda_tunableop_set_max_tuning_duration": "set_max_tuning_duration",
    "_cuda_tunableop_get_max_tuning_duration": "get_max_tuning_duration",
    "_cuda_tunableop_set_max_tuning_iterations": "set_max_tuning_iterations",
    "_cuda_tunableop_get_max_tuning_iterations": "get_max_tuning_iterations",
    "_cuda_tunableop_set_filename": "set_filename",
    "_cuda_tunableop_get_filename": "get_filename",
    "_cuda_tunableop_get_results": "get_results",
    "_cuda_tunableop_get_validators": "get_validators",
    "_cuda_tunableop_read_file": "read_file",
    "_cuda_tunableop_set_rotating_buffer_size": "set_rotating_buffer_size",
    "_cuda_tunableop_get_rotating_buffer_size": "get_rotating_buffer_size",
    "_cuda_tunableop_set_numerical_check_tolerances": "set_numerical_check_tolerances",
}

__all__ = ["PRIVATE_NAMES", "TunableOps"]
