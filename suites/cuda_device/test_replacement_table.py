"""The `torch.cuda` replacements as a table of named functions (harness/emulation/cuda_api.py):
each function checked alone against a device state that no emulation has entered, and the table's
rows checked as installed and restored."""

from __future__ import annotations

import inspect

import pytest
import torch

import harness
from harness.emulation import cuda_api
from harness.emulation.cuda_api import REPLACEMENTS, Replacement, patches
from harness.emulation.state import DeviceProperties, DeviceState


@pytest.fixture
def state():
    """Two emulated devices, never entered: the replacement functions see only this state."""
    return DeviceState(DeviceProperties(count=2))


def test_every_row_names_a_named_function_or_builder():
    for row in REPLACEMENTS:
        assert row.build.__name__ != "<lambda>" or row.kind == "value", row
        assert row.kind in ("call", "value")
    keys = [(row.owner, row.name) for row in REPLACEMENTS]
    assert len(keys) == len(set(keys)), "a torch attribute replaced twice"


def test_a_row_of_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="kind 'bound'"):
        Replacement("torch.cuda", "is_available", cuda_api.is_available, "bound")


def test_each_call_row_is_bound_to_the_state_as_its_own_function(state):
    built = patches(state)
    functions = [value for _, _, value in built if inspect.isfunction(value)]
    # torch._dynamo's trace rules refuse one function object known under two names
    names_by_object = {}
    for owner, name, value in built:
        if inspect.isfunction(value):
            names_by_object.setdefault(id(value), set()).add(name)
    assert all(len(names) == 1 for names in names_by_object.values())
    assert functions and all("state" not in inspect.signature(f).parameters for f in functions)


def test_device_queries(state):
    assert cuda_api.is_available(state) is True
    assert cuda_api.device_count(state) == 2
    assert not cuda_api.is_initialized(state)
    assert cuda_api.current_device(state) == 0 and cuda_api.is_initialized(state)
    cuda_api.set_device(state, 1)
    assert state.current_index == 1 and cuda_api.current_device_index(state) == 1
    cuda_api.set_device(state, -1)  # torch: a negative index changes nothing
    assert state.current_index == 1
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        cuda_api.set_device(state, 2)
    with pytest.raises(ValueError, match="Expected a cuda device, but got: cpu"):
        cuda_api.index(state, torch.device("cpu"))


def test_device_exchanges(state):
    assert cuda_api.exchange_device(state, 1) == 0 and state.current_index == 1
    assert cuda_api.maybe_exchange_device(state, 0) == 1 and state.current_index == 0
    assert cuda_api.exchange_device(state, -1) == -1 and state.current_index == 0
    assert cuda_api.exchange_device(state, None) == -1 and state.current_index == 0
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        cuda_api.exchange_device(state, 2)


def test_properties_name_and_capability(state):
    props = cuda_api.get_device_properties(state, 1)
    assert (props.major, props.minor) == cuda_api.get_device_capability(state) == (9, 0)
    assert cuda_api.get_device_name(state) == props.name == "NVIDIA H200 (emulated)"
    assert cuda_api.get_arch_list(state) == ["sm_90"]
    assert "total_memory=137110MB" in repr(props)


def test_memory_statistics_read_the_allocator_model(state):
    assert cuda_api.memory_allocated(state) == cuda_api.max_memory_allocated(state) == 0
    free, total = cuda_api.mem_get_info(state)
    assert free == total == state.properties.total_memory
    stats = cuda_api.memory_stats(state)
    assert stats["allocated_bytes.all.current"] == 0
    assert "allocated_bytes.all" in cuda_api.memory_summary(state, abbreviated=True)
    cuda_api.reset_peak_memory_stats(state)
    cuda_api.reset_accumulated_memory_stats(state)
    cuda_api.empty_cache(state)


def test_private_setters_check_their_values(state):
    cuda_api.set_sync_debug_mode(state, 1)  # torch.cuda converts "warn"
    assert cuda_api.get_sync_debug_mode(state) == 1
    cuda_api.set_memory_fraction(state, 0.5)
    assert state.memory_fraction_of(0) == 0.5
    with pytest.raises(ValueError):
        cuda_api.set_memory_fraction(state, 1.5)
    assert cuda_api.can_device_access_peer(state, 0, 1)
    assert not cuda_api.can_device_access_peer(state, 1, 1)
    assert not cuda_api.can_device_access_peer(state, 0, 2)


def test_streams_by_id(outside_emulation):
    # Streams belong to an active device: entered, but the function is called alone.
    with harness.emulate_cuda(device="cpu", device_count=2) as state:
        default = cuda_api.default_stream(state)
        # each call a new Stream object naming the stream, as torch builds one from its ids
        assert cuda_api.current_stream(state) == default
        assert cuda_api.current_stream(state) is not cuda_api.current_stream(state)
        cuda_api.cuda_set_stream(state, 0, 1)
        assert state.current_index == 1
        assert cuda_api.current_stream(state) == cuda_api.default_stream(state, 1) != default


def test_builders_of_values(state):
    generators = cuda_api.default_generators(state)
    assert [g.device for g in generators] == [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert generators is cuda_api.default_generators(state)  # the same objects each time
    assert cuda_api.cudnn_unavailable(state) is False
    assert cuda_api.is_bf16_supported(state) is True


def test_every_row_is_in_place_inside_and_restored_after(outside_emulation):
    before = {(row.owner, row.name): vars(cuda_api.owner_object(row.owner)).get(row.name)
              for row in REPLACEMENTS}
    with harness.emulate_cuda(device="cpu") as state:
        for row in REPLACEMENTS:
            owner = cuda_api.owner_object(row.owner)
            if row.kind == "value" or (row.if_present and before[(row.owner, row.name)] is None):
                continue  # a value may equal the original (None, a class torch already has)
            assert vars(owner).get(row.name) is not before[(row.owner, row.name)], row
        assert torch.cuda.device_count() == state.properties.count
    after = {(row.owner, row.name): vars(cuda_api.owner_object(row.owner)).get(row.name)
             for row in REPLACEMENTS}
    assert after == before


def test_dynamos_own_current_stream_is_the_devices(cuda_device):
    """From torch 2.15 dynamo's compiled frames and guards ask C++ for the current stream
    (`torch._C._dynamo.utils.get_current_stream`), which a CUDA wheel without a GPU answers with
    "CUDA driver version is insufficient": every compiled call on the device failed there."""
    import torch._dynamo.guards as guards
    import torch._dynamo.utils as utils

    if "get_current_stream" not in vars(utils):
        pytest.skip(f"torch {torch.__version__}'s dynamo asks torch.accelerator (before 2.15)")
    side = torch.cuda.Stream()
    for owner in (utils, guards):
        with torch.cuda.stream(side):
            got = owner.get_current_stream(torch.device("cuda", 0))
        assert isinstance(got, torch.Stream)
        assert (got.stream_id, got.device_index) == (side.stream_id, side.device_index)
    assert utils.get_current_stream is not guards.get_current_stream
