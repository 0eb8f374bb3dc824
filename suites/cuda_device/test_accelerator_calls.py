"""`torch.accelerator`'s device-generic calls and `torch.get_device_module()` without a device, as
a CUDA build answers them (harness/emulation/accelerator_calls.py): runtimes (SGLang's, torch's
own distributed and FSDP code) pick the device module and default device through them."""

from __future__ import annotations

import warnings

import pytest
import torch

import harness


def _needs(name: str) -> None:
    if not hasattr(torch.accelerator, name):
        pytest.skip(f"torch {torch.__version__} has no torch.accelerator.{name}")


def test_the_accelerators_module_is_cudas(cuda_kind):
    assert torch.get_device_module() is torch.cuda
    assert torch.get_device_module("cuda:0") is torch.cuda


def test_a_device_module_cached_outside_the_emulation_is_not_kept(outside_emulation):
    before = torch.get_device_module()  # cached: a CPU build's torch.cpu
    with harness.emulate_cuda(device="cpu"):
        inside = torch.get_device_module()
    assert inside is torch.cuda
    assert torch.get_device_module() is before


def test_memory_info_is_cudas_free_and_total(cuda_kind):
    _needs("get_memory_info")
    torch.ones(1, device="cuda")
    free, total = torch.accelerator.get_memory_info()
    assert total == torch.cuda.get_device_properties(0).total_memory
    assert 0 < free <= total
    held = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    if cuda_kind == "emulated":  # a real device's free memory moves with other processes too
        assert torch.accelerator.get_memory_info()[0] <= free - (64 << 20)
    del held


def test_device_capability_is_left_to_the_base_guard(cuda_kind):
    _needs("get_device_capability")
    with pytest.raises(RuntimeError, match="^Backend doesn't support getting device capabilities"):
        torch.accelerator.get_device_capability()


def test_accumulated_statistics_are_reset(cuda_kind):
    _needs("reset_accumulated_memory_stats")
    block = torch.empty(1000, device="cuda")
    del block
    assert torch.accelerator.memory_stats()["allocation.all.allocated"] > 0
    torch.accelerator.reset_accumulated_memory_stats()
    assert torch.accelerator.memory_stats()["allocation.all.allocated"] == 0


def test_empty_host_cache_releases_a_free_pinned_block(cuda_kind):
    _needs("empty_host_cache")
    torch.ones(1, device="cuda")
    torch.accelerator.empty_host_cache()
    pinned = torch.empty(100, pin_memory=True)
    del pinned
    cached = torch.cuda.memory.host_memory_stats_as_nested_dict()["allocations"]["current"]
    torch.accelerator.empty_host_cache()
    after = torch.cuda.memory.host_memory_stats_as_nested_dict()["allocations"]["current"]
    assert after == cached - 1


def test_an_accelerator_graph_is_refused_as_cuda_refuses_it(cuda_kind):
    _needs("Graph")
    with pytest.raises(RuntimeError, match="^Graph is not supported on device type: cuda$"):
        torch.accelerator.Graph()
    with pytest.raises(RuntimeError, match="^Graph is not supported on device type: cuda$"):
        torch.accelerator.graphs.Graph(pool=torch.cuda.graph_pool_handle())
    assert issubclass(torch.accelerator.Graph, torch._C._acceleratorGraph)


def test_a_device_of_another_type_is_refused_as_torchs_python_half_refuses_it(cuda_kind):
    with pytest.raises(ValueError, match="^cpu doesn't match the current accelerator cuda"):
        torch.accelerator.set_device_index("cpu")
    with pytest.raises(ValueError, match="^cpu doesn't match the current accelerator cuda"):
        torch.accelerator.current_stream(torch.device("cpu"))
    with pytest.raises(ValueError, match="^Expected a torch.device with a specified index"):
        torch.accelerator.set_device_index("cuda")
    stream = torch.accelerator.current_stream()
    for device in (stream.device, stream.device.index, str(stream.device), "cuda"):
        assert torch.accelerator.current_stream(device) == stream
    assert torch.accelerator.memory_allocated("cuda:0") == torch.accelerator.memory_allocated()


def test_a_generic_stream_is_torchs_type_and_equals_the_current_one(cuda_kind):
    previous = torch.accelerator.current_stream()
    first, second = torch.Stream(), torch.Stream()
    assert type(first) is not torch.cuda.Stream and not isinstance(first, torch.cuda.Stream)
    torch.accelerator.set_stream(first)
    assert torch.accelerator.current_stream() == first
    assert torch.accelerator.current_stream() != second
    rebuilt = torch.Stream(stream_id=first.stream_id, device_index=first.device_index,
                           device_type=first.device_type)
    assert first == rebuilt and not first != rebuilt
    torch.accelerator.set_stream(previous)
    with second:
        assert torch.accelerator.current_stream() == second
        assert torch.cuda.current_stream().stream_id == second.stream_id
        with first:
            assert torch.accelerator.current_stream() == first
    assert torch.accelerator.current_stream() == previous


def test_work_on_a_generic_stream_is_waited_for_through_an_event(cuda_kind):
    side, event = torch.Stream(), torch.Event()
    host = torch.arange(1000.0)
    with side:
        on_device = host.to("cuda", non_blocking=True) * 2
    event.record(side)
    torch.cuda.current_stream().wait_event(event)
    assert torch.equal(on_device.cpu(), host * 2)


def test_memory_statistics_are_read_once_the_allocator_is_set_up(cuda_kind):
    block = torch.randn(100, device="cuda")
    del block
    assert torch._C._accelerator_isAllocatorInitialized()
    active = torch.accelerator.memory_stats()["active_bytes.all.current"]
    held = torch.randn(256, device="cuda")
    assert torch.accelerator.memory_stats()["active_bytes.all.current"] == active + 1024
    del held


def _sine_under(context):
    def fn(x):
        with context(x.device.index):
            x = torch.sin(x + 1)
        return x

    return fn


@pytest.mark.parametrize("context", ["torch.cuda.device", "torch.accelerator.device_index"])
def test_a_device_context_compiles_in_a_fullgraph(cuda_kind, context):
    owner, name = context.rsplit(".", 1)
    found = getattr(torch.accelerator if owner == "torch.accelerator" else torch.cuda, name, None)
    if found is None:
        pytest.skip(f"torch {torch.__version__} has no {context}")
    fn = _sine_under(found)
    x = torch.randn(2, 2, device="cuda")
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    contexts = torch._dynamo.variables.ctx_manager
    if owner == "torch.accelerator" and not hasattr(contexts, "AcceleratorDeviceIndexVariable"):
        # torch 2.11's dynamo has no variable for it and skips the module, so a fullgraph compile
        # fails on CUDA too (H100, torch 2.11.0+cu130); later releases trace it.
        with pytest.raises(torch._dynamo.exc.Unsupported, match="inline function marked as skipped"):
            compiled(x)
        return
    assert torch.allclose(compiled(x), fn(x))
    assert torch.cuda.current_device() == 0


def test_torch_device_contexts_enter_and_leave_the_device(cuda_kind):
    before = torch.cuda.current_device()
    with torch.cuda.device(0):
        assert torch.cuda.current_device() == 0
    with torch.cuda.device_of(torch.ones(1, device="cuda")):
        assert torch.cuda.current_device() == 0
    with torch.cuda.device(None):
        assert torch.cuda.current_device() == before
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        with torch.cuda.device(torch.cuda.device_count()):
            pass
    assert torch.cuda.current_device() == before


def test_an_event_a_compiled_function_makes_is_recorded_on_the_device(cuda_kind):
    def with_an_event(t):
        event = torch.cuda.Event()
        event.record()
        y = t * 3
        event.wait()
        return y

    x = torch.ones(4, device="cuda")
    torch._dynamo.reset()
    out = torch.compile(with_an_event, backend="eager")(x)
    torch.cuda.synchronize()
    assert out.is_cuda and out.tolist() == [3.0] * 4


def test_the_device_module_is_cudas_inside_a_compiled_function(cuda_kind):
    def fn(t):
        return t.to(torch.get_device_module().current_device()) + 1

    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # dynamo knows the call (no lru_cache-wrapper warning)
        out = torch.compile(fn, backend="eager", fullgraph=True)(torch.zeros(2, device="cuda"))
    assert out.is_cuda and out.tolist() == [1.0, 1.0]


@pytest.fixture
def gloo_world_of_one(tmp_path):
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("a torch without distributed")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()


def test_fsdp_takes_the_accelerator_for_a_module_on_the_host(cuda_kind, gloo_world_of_one):
    # FSDP picks the device of a module on the host from torch._C._get_accelerator(): a CPU
    # build's cpu made it refuse ("FSDP needs a non-CPU accelerator device")
    from torch.distributed.fsdp import FullyShardedDataParallel

    wrapped = FullyShardedDataParallel(torch.nn.Linear(2, 2))
    assert wrapped.compute_device == torch.device("cuda", torch.cuda.current_device())


def test_fully_shards_default_mesh_is_the_accelerators(cuda_kind, gloo_world_of_one):
    from torch.distributed.fsdp import fully_shard

    module = torch.nn.Linear(2, 2)
    fully_shard(module)
    assert module.weight.device_mesh.device_type == "cuda"
    assert module(torch.ones(1, 2, device="cuda")).is_cuda


def test_a_barrier_on_a_devices_index_runs(cuda_kind, gloo_world_of_one):
    # the barrier allocates in C++ on the accelerator torch._C._get_accelerator() names, at the
    # index given: on the emulated device the build's own (a CPU build cannot allocate for cuda)
    gloo_world_of_one.barrier(device_ids=[0])
    gloo_world_of_one.barrier()
    assert torch.accelerator.current_accelerator() == torch.device("cuda")
