"""torch.profiler with CUDA activity on the emulated device (harness/emulation/profiling.py): each
device op is a kernel event on its stream, linked to the op that launched it; views launch none; a
graph replay is one cudaGraphLaunch and a kernel per node; device time shows in key_averages() and
the kernels in the exported Chrome trace. The `cuda_kind` rows hold on CUDA itself too."""

from __future__ import annotations

import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import harness

CUDA_ACTIVITY = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
_DEVICE = torch.autograd.DeviceType.CUDA


def _device_events(prof) -> list:
    return [e for e in prof.events() if e.device_type == _DEVICE]


def _row(prof, name: str):
    return next(row for row in prof.key_averages() if row.key == name)


def test_cuda_activity_records_without_cuda_event_warnings(cuda_kind, capfd):
    x = torch.randn(32, 32, device="cuda")
    with profile(activities=CUDA_ACTIVITY) as prof:
        y = x @ x
        torch.cuda.synchronize()
    prof.key_averages()
    err = capfd.readouterr().err
    assert "Failed to record CUDA event" not in err
    assert "CUDA used in profiler but not enabled" not in err
    assert y.is_cuda


def test_device_ops_are_kernels_linked_to_their_ops_and_views_launch_none(cuda_kind):
    x = torch.randn(32, 32, device="cuda")
    with profile(activities=CUDA_ACTIVITY) as prof:
        y = (x @ x).t()
        z = y + 1
        torch.cuda.synchronize()
    assert z.is_cuda
    assert _device_events(prof), "no device event recorded"
    assert all(e.device_time_total > 0 for e in _device_events(prof))
    assert _row(prof, "aten::mm").device_time_total > 0
    assert _row(prof, "aten::add").device_time_total > 0
    assert _row(prof, "aten::t").device_time_total == 0  # a view: no kernel on CUDA
    # cuBLASLt launches its GEMM with cudaLaunchKernelExC (measured on an H100, torch 2.11)
    launches = [e for e in prof.events() if e.name.startswith("cudaLaunchKernel")]
    assert len(launches) >= 2


def test_emulated_kernels_are_one_per_device_op_on_the_stream_it_ran_on(cuda_device):
    x = torch.randn(16, 16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with profile(activities=CUDA_ACTIVITY) as prof:
        a = x * 2
        b = a.view(256)  # a view: no kernel
        with torch.cuda.stream(side):
            c = x.neg()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
    assert b.is_cuda and c.is_cuda
    kernels = _device_events(prof)
    assert len(kernels) == 2
    by_op = {e.name: e for e in kernels}
    assert set(by_op) == {"aten::mul (emulated kernel)", "aten::neg (emulated kernel)"}
    assert by_op["aten::mul (emulated kernel)"].device_resource_id == 0
    assert by_op["aten::neg (emulated kernel)"].device_resource_id == side.stream_id
    assert _row(prof, "aten::neg").self_device_time_total > 0
    assert _row(prof, "aten::mul (emulated kernel)").count == 1


def test_copies_between_host_and_device_are_memcpys(cuda_device):
    host = torch.randn(8)
    with profile(activities=CUDA_ACTIVITY) as prof:
        d = host.cuda()
        back = d.cpu()
    assert torch.equal(back, host)
    names = sorted(e.name for e in _device_events(prof))
    assert names == ["Memcpy DtoH (Device -> Pageable)", "Memcpy HtoD (Pageable -> Device)"]
    assert sum(e.name == "cudaMemcpyAsync" for e in prof.events()) == 2


def _captured_graph(x):
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x * 2
        y = y + 1
        y = torch.neg(y)
        y = y.abs()
    return graph, y


def test_a_replay_is_one_graph_launch_and_a_kernel_per_node(cuda_kind):
    if cuda_kind == "sanitizer":
        pytest.skip("the sanitizer replays its recording op by op on the GPU: no cudaGraphLaunch")
    x = torch.randn(64, device="cuda")
    graph, y = _captured_graph(x)
    torch.cuda.synchronize()
    with profile(activities=CUDA_ACTIVITY) as prof:
        graph.replay()
        torch.cuda.synchronize()
    assert torch.allclose(y, (x * 2 + 1).neg().abs())
    names = [e.name for e in prof.events()]
    assert names.count("cudaGraphLaunch") == 1
    assert len(_device_events(prof)) == 4
    host_ops = [e.name for e in prof.events()
                if e.device_type != _DEVICE and e.name.startswith("aten::")]
    assert not host_ops  # a replay runs no op on the host
    assert sum(e.self_device_time_total for e in _device_events(prof)) > 0


def test_replays_count_their_kernels_each_time(cuda_device):
    x = torch.randn(64, device="cuda")
    graph, _ = _captured_graph(x)
    with profile(activities=CUDA_ACTIVITY) as prof:
        for _ in range(3):
            with torch.profiler.record_function("decode step"):
                graph.replay()
    assert len(_device_events(prof)) == 12
    assert _row(prof, "cudaGraphLaunch").count == 3
    assert _row(prof, "decode step").device_time_total > 0  # the kernels are the step's


def test_the_chrome_trace_holds_the_device_events(cuda_kind, tmp_path):
    x = torch.randn(32, 32, device="cuda")
    with profile(activities=CUDA_ACTIVITY) as prof:
        y = x @ x + 1
        torch.cuda.synchronize()
    assert y.is_cuda
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    entries = json.loads(path.read_text())["traceEvents"]
    kernels = [e for e in entries if e.get("cat") == "kernel"]
    assert len(kernels) >= 2
    assert all(e["dur"] > 0 for e in kernels)
    if cuda_kind == "emulated":
        assert len(kernels) == len(_device_events(prof))
        assert not [e for e in entries if "harness::" in str(e.get("name"))]


def test_a_profile_without_cuda_activity_records_no_device_event(cuda_device):
    x = torch.randn(8, device="cuda")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        x.neg()
    assert cuda_device.kernel_log is None
    assert not _device_events(prof)
    assert _row(prof, "aten::neg").device_time_total == 0


def test_the_launch_log_is_off_once_the_profile_ends(cuda_device):
    x = torch.randn(8, device="cuda")
    with profile(activities=CUDA_ACTIVITY):
        assert cuda_device.kernel_log is not None
        x.neg()
    assert cuda_device.kernel_log is None


def test_nvtx_and_the_cuda_profiler_switch_run(cuda_kind):
    x = torch.randn(8, device="cuda")
    torch.cuda.profiler.start()
    x.neg()
    torch.cuda.profiler.stop()
    with torch.autograd.profiler.emit_nvtx():
        y = x.neg()
    assert torch.equal(y.cpu(), -x.cpu())


def test_the_profiler_is_torchs_own_again_after_the_emulation(outside_emulation):
    profile_class = torch.autograd.profiler.profile
    before = {name: vars(profile_class)[name] for name in
              ("__init__", "__exit__", "_start_trace", "_parse_kineto_results",
               "export_chrome_trace")}
    with harness.emulate_cuda(device="cpu"):
        assert vars(profile_class)["__init__"] is not before["__init__"]
    assert {name: vars(profile_class)[name] for name in before} == before
