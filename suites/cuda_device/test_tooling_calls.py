"""torch.cuda calls runtimes make at start-up or in passing: TunableOp's settings, a stream from a
raw handle, NVTX ranges and `__cuda_array_interface__`. Each raised AttributeError inside the emulation on a
CPU build before; the settings and the stream are checked against CUDA too (`cuda_kind`)."""

from __future__ import annotations

import pytest
import torch

from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice


def test_tunable_op_starts_with_cudas_defaults(cuda_kind):
    tunable = torch.cuda.tunable
    if tunable.is_enabled():
        pytest.skip("TunableOp was enabled in this process before the test")
    assert (tunable.tuning_is_enabled(), tunable.record_untuned_is_enabled()) == (True, False)
    assert (tunable.get_max_tuning_duration(), tunable.get_max_tuning_iterations()) == (30, 100)
    assert tunable.get_results() == ()
    assert tunable.get_validators()[0] == ("PT_VERSION", torch.__version__.split("+")[0])


def test_tunable_op_keeps_its_settings(cuda_kind):
    tunable = torch.cuda.tunable
    saved = (tunable.is_enabled(), tunable.tuning_is_enabled(), tunable.get_max_tuning_iterations(),
             tunable.get_filename())
    try:
        tunable.enable(True)
        tunable.tuning_enable(False)
        tunable.set_max_tuning_iterations(7)
        tunable.set_filename("tuned.csv")
        assert (tunable.is_enabled(), tunable.tuning_is_enabled()) == (True, False)
        assert (tunable.get_max_tuning_iterations(), tunable.get_filename()) == (7, "tuned.csv")
    finally:
        tunable.enable(saved[0])
        tunable.tuning_enable(saved[1])
        tunable.set_max_tuning_iterations(saved[2])
        tunable.set_filename(saved[3])


def test_reading_a_tunable_op_results_file_is_refused_by_name(cuda_device, tmp_path):
    with pytest.raises(UnsupportedOnEmulatedDevice, match="TunableOp's results name CUDA GEMM"):
        torch.cuda.tunable.read_file(str(tmp_path / "results.csv"))


def test_a_stream_from_a_raw_handle_is_the_default_stream_or_wraps_the_handle(cuda_kind):
    default = torch.cuda.default_stream()
    assert torch.cuda.get_stream_from_external(default.cuda_stream) == default
    side = torch.cuda.Stream()
    found = torch.cuda.get_stream_from_external(side.cuda_stream)
    assert found.cuda_stream == side.cuda_stream
    # CUDA's answer, measured on an H200 (torch 2.11): another stream object, unequal to `side`
    # (its stream id comes from the raw handle), while two wrappers of one handle are equal. Its
    # work still goes to `side`'s queue (test_external_streams.py).
    assert found != side and found.stream_id != side.stream_id
    assert torch.cuda.get_stream_from_external(side.cuda_stream) == found
    assert torch.cuda.ExternalStream(side.cuda_stream) == found


def test_an_nvtx_range_start_answers_0_with_no_tool_attached(cuda_kind):
    # NVTX hands out range ids only to a tool (Nsight); without one nvtxRangeStartA answers 0 each
    # time (measured on an H200, torch 2.11), where the emulated device counted 1, 2, ...
    first = torch.cuda.nvtx.range_start("step")
    torch.cuda.nvtx.range_end(first)
    second = torch.cuda.nvtx.range_start("step")
    torch.cuda.nvtx.range_end(second)
    assert (first, second) == (0, 0)


def test_the_cuda_array_interface_of_a_device_tensor_is_refused_by_name(cuda_device):
    x = torch.ones(2, 3, device="cuda")
    with pytest.raises(UnsupportedOnEmulatedDevice, match="raw CUDA device pointer"):
        x.__cuda_array_interface__
    with pytest.raises(AttributeError, match="non-CUDA tensor"):  # a host tensor: torch's answer
        torch.ones(2).__cuda_array_interface__
