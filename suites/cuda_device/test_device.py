"""The emulated CUDA device: torch.cuda's answers, device memory kept apart from host memory, and
CUDA's rules for mixing, copying, pinning and host reads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import harness

MIXED = "Expected all tensors to be on the same device, but found at least two devices"


def test_torch_cuda_answers_for_the_emulated_device(cuda_device):
    assert torch.cuda.is_available() and torch.cuda.device_count() == 1
    assert torch.cuda.current_device() == 0
    props = torch.cuda.get_device_properties(0)
    assert props.name == torch.cuda.get_device_name() == "NVIDIA H200 (emulated)"
    assert torch.cuda.get_device_capability() == (props.major, props.minor) == (9, 0)
    free, total = torch.cuda.mem_get_info()
    assert total == props.total_memory and free <= total
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.cuda.set_device(3)


def test_tensors_on_cuda_are_device_tensors(cuda_device):
    for device in ("cuda", "cuda:0", torch.device("cuda"), 0):
        x = torch.zeros(2, device=device)
        assert x.is_cuda and x.device == torch.device("cuda", 0) and x.device.type == "cuda"
        assert x.get_device() == 0 and not x.is_cpu
    host = torch.zeros(2)
    assert not host.is_cuda and host.device.type == "cpu" and host.get_device() == -1
    assert host.cuda().is_cuda and host.to("cuda").is_cuda and torch.nn.Linear(2, 2).cuda().weight.is_cuda
    assert "device='cuda:0'" in repr(torch.ones(1, device="cuda"))


def test_default_device_and_device_context_make_device_tensors(cuda_device):
    with torch.device("cuda"):
        assert torch.zeros(2).is_cuda
    torch.set_default_device("cuda")
    try:
        assert torch.ones(2).is_cuda and torch.nn.Linear(2, 2).weight.is_cuda
    finally:
        torch.set_default_device(None)
    assert not torch.ones(2).is_cuda


def test_an_op_mixing_device_and_host_tensors_raises_cudas_error(cuda_device):
    x = torch.ones(3, device="cuda")
    with pytest.raises(RuntimeError, match=MIXED):
        x + torch.ones(3)
    with pytest.raises(RuntimeError, match=MIXED):
        torch.ones(3, 3) @ torch.ones(3, 3, device="cuda")
    assert (x + torch.tensor(2.0)).tolist() == [3.0, 3.0, 3.0]  # a 0-dim host tensor is a scalar
    x[torch.tensor([0, 2])] = torch.tensor([5.0, 6.0])  # indexing takes host indices and values
    assert x.tolist() == [5.0, 1.0, 6.0]


def test_a_cpu_generator_for_a_random_op_on_the_device_raises_cudas_error(cuda_device):
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(RuntimeError, match="Expected a 'cuda' device type for generator but found 'cpu'"):
        torch.randn(4, generator=gen, device="cuda")
    with torch.device("cuda"), pytest.raises(RuntimeError, match="for generator but found 'cpu'"):
        torch.randn(4, generator=gen)
    with pytest.raises(RuntimeError, match="for generator but found 'cpu'"):
        torch.empty(4, device="cuda").normal_(generator=gen)
    assert torch.randn(4, generator=gen).device.type == "cpu"  # a host draw takes it
    assert torch.randn(4, generator=gen, device="cpu").cuda().is_cuda


def test_a_cuda_generator_drives_the_devices_random_ops_and_only_those(cuda_device):
    gen = torch.Generator(device="cuda")
    assert gen.device == torch.device("cuda", 0) and isinstance(gen, torch.Generator)
    assert isinstance(torch.default_generator, torch.Generator)
    first = torch.randn(4, device="cuda", generator=gen.manual_seed(7))
    again = torch.empty(4, device="cuda").normal_(generator=gen.manual_seed(7))
    assert first.is_cuda and torch.equal(first, again)
    with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator but found 'cuda'"):
        torch.randn(4, generator=gen)
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.Generator(device="cuda:1")
    assert torch.Generator().device == torch.device("cpu")


def test_crossing_between_the_memories_copies(cuda_device):
    host = torch.ones(3)
    device = host.to("cuda")
    host.fill_(7)
    assert device.tolist() == [1.0, 1.0, 1.0]
    back = device.cpu()
    back.fill_(9)
    assert device.tolist() == [1.0, 1.0, 1.0] and not back.is_cuda
    assert device.to("cuda") is device and host.cpu() is host
    with pytest.raises(TypeError, match="can't convert cuda:0 device type tensor to numpy"):
        device.numpy()
    with pytest.raises(TypeError, match="Use Tensor.cpu"):
        np.asarray(device)


def test_pinned_host_memory(cuda_device):
    assert torch.ones(3).pin_memory().is_pinned()
    assert torch.empty(3, pin_memory=True).is_pinned()
    assert not torch.ones(3).is_pinned()
    assert not torch.ones(3).pin_memory().cuda().is_pinned()


def test_host_reads_of_device_tensors_are_syncs_the_observer_hears(cuda_device):
    class Syncs:
        def __init__(self):
            self.seen = []

        def on_sync(self, what, tensor, stream):
            self.seen.append(what)

    x = torch.ones(2, device="cuda")
    with cuda_device.observe(Syncs()) as syncs:
        x.sum().item()
        x.tolist()
        bool(x[0])
        x.cpu()
        torch.cuda.synchronize()
    assert syncs.seen == ["item", "tolist", "__bool__", "Tensor.cpu", "torch.cuda.synchronize"]


def test_memory_statistics_follow_live_device_tensors(cuda_device):
    before = torch.cuda.memory_allocated()
    x = torch.empty(1024, device="cuda")
    assert torch.cuda.memory_allocated() == before + 4096
    assert torch.cuda.max_memory_allocated() >= before + 4096
    assert torch.cuda.memory_stats()["active_bytes.all.current"] == before + 4096
    freed = torch.cuda.memory_stats()["allocated_bytes.all.freed"]
    del x
    assert torch.cuda.memory_allocated() == before
    assert torch.cuda.memory_stats()["allocated_bytes.all.freed"] == freed + 4096
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == before


def test_gradients_of_device_parameters_are_device_tensors(cuda_device):
    layer = torch.nn.Linear(3, 2).cuda()
    layer(torch.ones(4, 3, device="cuda")).sum().backward()
    assert layer.weight.grad.is_cuda
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    opt.step()  # would mix devices if a gradient were host memory
    (grad,) = torch.autograd.grad(layer(torch.ones(1, 3, device="cuda")).sum(), [layer.bias])
    assert grad.is_cuda


def test_compiled_code_on_device_tensors_returns_device_tensors(cuda_device):
    @torch.compile(backend="eager")
    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    x, w = torch.randn(4, 8, device="cuda"), torch.ones(8, device="cuda")
    out = norm(x, w)
    assert out.is_cuda
    torch.testing.assert_close(out + x, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) + x)
    assert not norm(torch.ones(2, 8), torch.ones(8)).is_cuda


def test_a_request_of_an_exabyte_or_more_gets_cudas_own_refusal(cuda_device):
    # c10's allocator checks the size before the device (PyTorch's test_out_of_memory).
    with pytest.raises(torch.OutOfMemoryError,
                       match=r"^CUDA out of memory\. Tried to allocate more than 1EB memory\.$"):
        torch.empty(1024 * 1024 * 1024 * 8000000000, dtype=torch.int8, device="cuda")
    with pytest.raises(torch.OutOfMemoryError, match=r"Tried to allocate 800000000\.00 GiB"):
        torch.empty(1024 * 1024 * 1024 * 800000000, dtype=torch.int8, device="cuda")


def test_a_factory_beyond_the_device_capacity_raises_cudas_oom_before_touching_the_host(
        outside_emulation):
    with harness.emulate_cuda(device="cpu", total_memory=2**20):
        kept = torch.empty(2**18 - 256, device="cuda")  # 1 KiB short of the device's 1 MiB
        with pytest.raises(torch.OutOfMemoryError) as refused:
            torch.zeros(512, device="cuda")
        assert str(refused.value).startswith("CUDA out of memory. Tried to allocate 2.00 KiB. GPU 0 "
                                             "has a total capacity of 1024.00 KiB of which 1024 bytes "
                                             "is free.")
        with pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                torch.zeros(2**40, device="cuda")
        del kept
        assert torch.zeros(512, device="cuda").sum().item() == 0  # fits once the memory is free


def test_memory_made_on_a_side_stream_belongs_to_it(cuda_device):
    # torch.as_tensor(x, device="cuda") is made in C++, not by an op the stream tracking sees;
    # freeing it on the stream that made and used it is no race.
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(3):
            scalar = torch.as_tensor(0.5, device="cuda").clone().detach()
            scalar.mul_(2)
            del scalar
        torch.zeros(1, device="cuda").add_(1)
    torch.cuda.synchronize()


def test_the_device_has_no_cudnn_whatever_torch_was_built_with(cuda_device):
    import warnings

    x = torch.zeros(2, 3, 4, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a CPU build's "compiled without cuDNN" warning is not it
        assert not torch.backends.cudnn.is_available()
        assert not torch.backends.cudnn.is_acceptable(x)
    lstm = torch.nn.LSTM(4, 5).cuda()  # flattens its weights through cuDNN when it is acceptable
    out, _ = lstm(x)
    out.sum().backward()
    assert out.is_cuda and lstm.weight_ih_l0.grad.is_cuda


def test_tooling_calls_a_runtime_makes_in_passing_answer_as_on_cuda(outside_emulation):
    import warnings

    with harness.emulate_cuda(device="cpu", total_memory=2**20, device_count=2):
        # NVTX with no profiler attached: no range tracking (-2), as measured on an H100
        assert [torch.cuda.nvtx.range_push("step"), torch.cuda.nvtx.range_push("attn"),
                torch.cuda.nvtx.range_pop(), torch.cuda.nvtx.range_pop()] == [-2, -2, -2, -2]
        with torch.cuda.nvtx.range("decode"):
            torch.cuda.nvtx.mark("replay")
        x = torch.ones(4, device="cuda")
        torch.cuda.set_sync_debug_mode("warn")
        with pytest.warns(UserWarning, match="called a synchronizing CUDA operation"):
            x.sum().item()
        torch.cuda.set_sync_debug_mode("error")
        assert torch.cuda.get_sync_debug_mode() == 2
        with pytest.raises(RuntimeError, match="called a synchronizing CUDA operation"):
            x.cpu()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.cuda.synchronize()  # an explicit synchronize is not flagged, as on CUDA
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.set_per_process_memory_fraction(0.5)
        with pytest.raises(torch.OutOfMemoryError, match="per-process memory fraction 0.5"):
            torch.empty(2**17 + 64, device="cuda")  # more than half of the 1 MiB device
        assert torch.cuda.can_device_access_peer(0, 1) and not torch.cuda.can_device_access_peer(0, 0)


def test_stream_tracking_that_starts_inside_a_users_dispatch_mode_leaves_that_mode_intact(cuda_device):
    from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            return func(*args, **(kwargs or {}))

    x = torch.ones(4, device="cuda")
    before = list(_get_current_dispatch_mode_stack())
    with Count() as count:
        side = torch.cuda.Stream()  # a second stream: tracking may begin here, inside Count
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = x * 2
        torch.cuda.current_stream().wait_stream(side)
        assert _get_current_dispatch_mode_stack()[-1] is count  # still the innermost mode
    stack = _get_current_dispatch_mode_stack()
    assert count not in stack and all(m in stack for m in before)
    assert count.ops >= 1 and y.sum().item() == 8


def test_the_allocator_accounting_starts_when_first_asked_with_the_storages_alive_then(
        outside_emulation):
    with harness.emulate_cuda(device="cpu") as state:
        kept = torch.empty(1000, device="cuda")  # 4000 bytes: one 4096-byte block once counted
        for _ in range(50):
            torch.empty(3000, device="cuda")  # made and freed before anyone asks
        assert state.memory.live_bytes() == 4000
        stats = torch.cuda.memory_stats()  # the accounting starts here
        assert stats["allocated_bytes.all.current"] == 4096 and stats["allocation.all.current"] == 1
        # The counts and peaks go back to the first allocation, as on CUDA (counted cheaply).
        assert stats["allocation.all.allocated"] == 51 and stats["allocation.all.peak"] == 2
        assert stats["allocated_bytes.all.freed"] == 50 * 12288
        assert stats["allocated_bytes.all.peak"] == 4096 + 12288
        assert stats["reserved_bytes.all.current"] == 2 * 1024 * 1024  # one small segment
        more = torch.empty(1000, device="cuda")
        assert torch.cuda.memory_allocated() == 2 * 4096
        del kept, more
        assert torch.cuda.memory_allocated() == 0


def test_stream_tracking_that_starts_inside_inference_mode_still_tracks_after_it(cuda_device):
    from harness.emulation.tracking import RaceError

    with torch.inference_mode():
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):  # the first sign of asynchrony: tracking may start here
            torch.ones(4, device="cuda").mul_(2)
        side.synchronize()
    # Leaving the block restored the dispatch keys it found, without tracking's Python key.
    staging = torch.zeros(4, pin_memory=True)
    on_device = torch.zeros(4, device="cuda")
    on_device.copy_(staging, non_blocking=True)
    with pytest.raises(RaceError, match="host write while device work on the memory is pending"):
        staging.fill_(1.0)
    torch.cuda.synchronize()


def test_a_capture_after_tracking_started_inside_inference_mode_records_its_ops(cuda_device):
    from harness.graphs import get_backend

    with torch.inference_mode():
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            torch.ones(4, device="cuda").mul_(2)
        side.synchronize()
    backend = get_backend("emulated", torch.device("cpu"))  # the plain emulator, inside the device
    x, out = torch.ones(4), torch.zeros(4)
    graph = backend.capture(lambda: out.copy_(x * 3))
    x.fill_(2.0)
    graph.replay()
    assert out.tolist() == [6.0] * 4  # the replay ran the recorded ops on the new input


def test_device_properties_name_sm_90s_shared_memory_and_memory_bus(cuda_device):
    """The fields kernel libraries size their tiles from, with an H200's values."""
    props = torch.cuda.get_device_properties(0)
    assert props.shared_memory_per_block == 48 * 1024
    assert props.shared_memory_per_block_optin == 227 * 1024
    assert props.shared_memory_per_multiprocessor == 228 * 1024
    assert props.memory_bus_width == 6144 and props.memory_clock_rate > 0
    assert (props.pci_bus_id, props.pci_device_id, props.pci_domain_id) == (0, 0, 0)


def test_an_event_names_its_device(cuda_device):
    assert torch.Event("cuda").device == torch.device("cuda", 0)
    event = torch.cuda.Event()
    assert event.device is None  # CUDA makes the event at its first record
    event.record()
    assert event.device == torch.device("cuda", 0)


def test_the_first_device_tensor_initializes_cuda(cuda_device):
    """On CUDA making a tensor on the device runs torch.cuda's lazy init, and the functions gated
    on `is_initialized()` (caching_allocator_enable, memory_stats) act from then on."""
    torch.zeros(1, device="cuda")
    assert torch.cuda.is_initialized()
