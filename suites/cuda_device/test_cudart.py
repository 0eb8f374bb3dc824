"""`torch.cuda.cudart()` on the emulated device: the profiler switches that runtimes call around a
run succeed, memory info answers as mem_get_info, host registration is refused with the remedy."""

from __future__ import annotations

import pytest
import torch


def test_the_profiler_switches_succeed(cuda_device):
    runtime = torch.cuda.cudart()
    before = runtime.profiler_runs
    torch.cuda.profiler.start()
    torch.cuda.profiler.stop()
    with torch.cuda.profiler.profile():
        torch.ones(2, device="cuda").sum()
    assert runtime.profiler_runs == before + 2


def test_memory_info_is_mem_get_info(cuda_device):
    held = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    assert torch.cuda.cudart().cudaMemGetInfo(0) == torch.cuda.mem_get_info(0)
    del held


def test_error_codes_read_as_cuda_reads_them(cuda_device):
    torch.cuda.check_error(0)
    runtime = torch.cuda.cudart()
    assert runtime.cudaError.success == 0
    assert runtime.cudaGetErrorString(runtime.cudaError(1)) == "invalid argument"


def test_check_error_raises_cudas_text_for_any_code(cuda_device):
    # PyTorch's test_check_error hands check_error a code the emulated runtime never returns.
    with pytest.raises(torch.cuda.CudaError, match=r"^out of memory \(2\)$"):
        torch.cuda.check_error(2)
    with pytest.raises(torch.cuda.CudaError, match=r"unrecognized error code 9999"):
        torch.cuda.check_error(9999)


def test_host_registration_is_refused_with_the_remedy(cuda_device):
    host = torch.ones(4)
    code = torch.cuda.cudart().cudaHostRegister(host.data_ptr(), host.nbytes, 0)
    with pytest.raises(torch.cuda.CudaError, match=r"operation not supported.*pin_memory\(\).*\(801\)"):
        torch.cuda.check_error(code)


def test_a_stream_made_through_the_runtime_wraps_as_an_external_stream(cuda_kind):
    """cudaStreamCreate writes the new stream's handle where it is told, and ExternalStream and
    get_stream_from_external wrap it (PyTorch's test_cuda_multigpu.py `test_external_streams`;
    the emulated runtime had neither call until 2026-12-06)."""
    import ctypes

    runtime = torch.cuda.cudart()
    handle = ctypes.c_ulonglong(0)
    assert runtime.cudaStreamCreate(ctypes.addressof(handle)) == 0
    assert handle.value != 0
    try:
        external = torch.cuda.ExternalStream(handle.value)
        assert (external.cuda_stream, external.device.index) == (handle.value, 0)
        assert torch.cuda.get_stream_from_external(handle.value, 0).cuda_stream == handle.value
        with torch.cuda.stream(external):
            x = torch.ones(4, device="cuda") * 2
        external.synchronize()
        assert x.sum().item() == 8
    finally:
        assert runtime.cudaStreamDestroy(handle.value) == 0
