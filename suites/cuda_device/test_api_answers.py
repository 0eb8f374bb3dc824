"""torch.cuda calls a runtime makes in passing, answered as CUDA answers them. Each row differed on
the emulated device until 2026-12-06 (a sweep of the API run natively on an H100, torch 2.11, and
under the emulation); the `cuda_kind` rows are checked against CUDA itself on a GPU."""

from __future__ import annotations

import pytest
import torch

from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice


def test_elapsed_time_of_unfit_events_is_a_value_error(cuda_kind):
    untimed = torch.cuda.Event(), torch.cuda.Event()
    for event in untimed:
        event.record()
    untimed[1].synchronize()
    with pytest.raises(ValueError, match="Both events must be created with argument 'enable_timing=True'"):
        untimed[0].elapsed_time(untimed[1])
    unrecorded = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with pytest.raises(ValueError, match="Both events must be recorded before calculating elapsed time"):
        unrecorded[0].elapsed_time(unrecorded[1])


def test_stream_priorities_span_torchs_compiled_range(cuda_kind):
    assert torch.cuda.Stream.priority_range() == (0, -3)
    assert torch.cuda.Stream(priority=-9).priority == -3
    assert torch.cuda.Stream(priority=-1).priority == -1


def test_a_negative_device_index_makes_the_device_context_a_no_op(cuda_kind):
    before = torch.cuda.current_device()
    with torch.cuda.device(-1):
        assert torch.cuda.current_device() == before


def test_an_index_past_the_devices_is_cudas_error_type(cuda_kind):
    count = torch.cuda.device_count()
    with pytest.raises(AssertionError, match="Invalid device id"):
        torch.cuda.get_device_properties(count + 3)
    with pytest.raises(torch.AcceleratorError, match="invalid device ordinal"):
        torch.empty(1, device=f"cuda:{count + 3}")


def test_device_properties_carry_the_clock_and_block_limits(cuda_kind):
    props = torch.cuda.get_device_properties(0)
    assert props.max_threads_per_block == 1024
    assert props.clock_rate > 0


def test_a_host_tensor_has_no_stream_to_record(cuda_kind):
    with pytest.raises(NotImplementedError, match="Could not run 'aten::record_stream' with arguments from the 'CPU' backend"):
        torch.ones(2).record_stream(torch.cuda.Stream())
    torch.ones(2, device="cuda").record_stream(torch.cuda.Stream())  # device memory: accepted


def test_a_device_generator_made_during_capture_is_refused(cuda_kind):
    if cuda_kind == "sanitizer":
        pytest.skip("the sanitizer's generators are torch's own: it refuses the generator's first "
                    "draw in the capture instead (docs/fidelity.md)")
    x = torch.ones(4, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="Cannot construct a new CUDAGeneratorImpl during CUDA graph capture"):
        with torch.cuda.graph(graph):
            x.mul_(2)
            torch.Generator(device="cuda")
    torch.Generator(device="cuda")  # outside a capture: made


def test_gpu_processes_are_listed(cuda_device):
    assert torch.cuda.list_gpu_processes() == "GPU:0\nno processes are running"


@pytest.mark.parametrize("reading", ["utilization", "memory_usage", "temperature", "power_draw",
                                     "clock_rate"])
def test_nvml_readings_are_refused_by_name(cuda_device, reading):
    with pytest.raises(UnsupportedOnEmulatedDevice, match=f"torch.cuda.{reading}\\(\\) .* NVML"):
        getattr(torch.cuda, reading)()


def test_jiterator_kernels_are_refused_by_name(cuda_device):
    double = torch.cuda.jiterator._create_jit_fn("template <typename T> T twice(T x) { return 2 * x; }")
    with pytest.raises(UnsupportedOnEmulatedDevice, match="torch.cuda.jiterator .* NVRTC"):
        double(torch.ones(2, device="cuda"))


def test_the_accelerators_current_stream_is_a_generic_stream(cuda_kind):
    if cuda_kind == "sanitizer":
        pytest.skip("the sanitizer's streams are CUDA's own: torch answers for them")
    acc, cur = torch.accelerator.current_stream(), torch.cuda.current_stream()
    assert isinstance(acc, torch.Stream) and not isinstance(acc, torch.cuda.Stream)
    # torch.cuda.Stream.__eq__ takes its own type only: unequal, though both name one stream
    assert not acc == cur and not cur == acc
    assert acc == torch.accelerator.current_stream()
    assert (acc.stream_id, acc.device_index, acc.device) == (cur.stream_id, cur.device_index,
                                                             torch.device("cuda", 0))
    rebuilt = torch.cuda.Stream(stream_id=acc.stream_id, device_index=acc.device_index,
                                device_type=acc.device_type)
    assert rebuilt == cur
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert torch.accelerator.current_stream().stream_id == side.stream_id
    torch.accelerator.set_stream(torch.Stream(stream_id=side.stream_id,
                                              device_index=side.device_index,
                                              device_type=side.device_type))
    assert torch.cuda.current_stream() == side
    torch.accelerator.set_stream(cur)
    assert torch.cuda.current_stream() == cur


def test_the_accelerators_stream_works_where_a_cuda_stream_does(cuda_kind):
    if cuda_kind == "sanitizer":
        pytest.skip("the sanitizer's streams are CUDA's own: torch answers for them")
    acc = torch.accelerator.current_stream()
    side = torch.cuda.Stream()
    x = torch.ones(4, device="cuda")
    side.wait_stream(acc)
    event = torch.cuda.Event()
    event.record(acc)
    side.wait_event(event)
    x.record_stream(acc)
    acc.synchronize()
    assert acc.query()
    with acc:
        assert torch.cuda.current_stream().stream_id == acc.stream_id


def test_a_second_capture_end_on_another_stream_is_refused(cuda_kind):
    x = torch.ones(4, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x.mul_(2)
    # ended by torch.cuda.graph on its capture stream; the default stream is current again
    with pytest.raises(RuntimeError, match="Capture must end on the same stream it began on"):
        graph.capture_end()
