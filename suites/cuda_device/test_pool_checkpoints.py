"""CUDA's caching-allocator calls that PyTorch's cudagraph trees make, one by one, on the emulated
device's graph pools (harness/emulation/pool_checkpoints.py), then torch's own trees driven
directly over them. Each check fails without that module (the names were missing or raised);
the `cuda_kind` rows run natively on a GPU to show CUDA's answer (the graph sanitizer runs real
CUDA's allocator, so its rows are left out)."""

from __future__ import annotations

import gc

import pytest
import torch

from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice

FLOATS = 1024  # 4 KiB: a block of its own in any pool


# torch 2.11 lacks the storage swap that moves an allocation routed to a graph pool into the
# pool's memory: there the emulated device counts the routing but refuses checkpoints by name
CAN_MOVE_INTO_POOL = hasattr(torch.UntypedStorage, "_swap_data_ptr_")
NO_SWAP = "this torch lacks UntypedStorage._swap_data_ptr_: the emulated pool refuses checkpoints"


@pytest.fixture
def kind(cuda_kind):
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer runs CUDA's own allocator: the native row is CUDA's")
    return cuda_kind


@pytest.fixture
def pool_kind(kind):
    """`kind`, less the emulated row where routed allocations cannot join the pool's memory."""
    if kind == "emulated" and not CAN_MOVE_INTO_POOL:
        pytest.skip(NO_SWAP)
    return kind


def _live_blocks(pool) -> int:
    """Blocks of graph pool `pool` a tensor or an unowned allocation holds, as a snapshot lists."""
    return sum(block["state"] == "active_allocated"
               for segment in torch.cuda.memory_snapshot() if segment["segment_pool_id"] == pool
               for block in segment["blocks"])


def _kept_pool():
    """A graph pool held by an empty capture, as the trees' manager holds theirs."""
    graph, pool = torch.cuda.CUDAGraph(), torch.cuda.graph_pool_handle()
    stream = torch.cuda.Stream()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        pass
    return graph, pool, stream


def _routed(pool, make):
    """`make()` with this thread's allocations on device 0 routed to `pool`."""
    torch._C._cuda_beginAllocateCurrentThreadToPool(0, pool)
    try:
        return make()
    finally:
        torch._C._cuda_endAllocateToPool(0, pool)
        torch._C._cuda_releasePool(0, pool)


def test_an_allocation_routed_to_a_pool_is_a_block_of_it(kind):
    """beginAllocateCurrentThreadToPool, endAllocateToPool, releasePool: what the thread allocates
    meanwhile is a block of the graph pool, held while its tensor lives; after, allocations are
    the regular pool's again."""
    graph, pool, _ = _kept_pool()
    x = _routed(pool, lambda: torch.ones(FLOATS, device="cuda"))
    y = torch.ones(FLOATS, device="cuda")
    assert _live_blocks(pool) == 1
    del x
    assert _live_blocks(pool) == 0
    del y, graph


def test_a_graph_reads_a_routed_allocation_after_its_tensor_died(pool_kind):
    """A graph pool's bytes stay the pool's: a graph that read a tensor allocated in the pool
    outside the capture (the trees' copies of a recording's inputs) reads the same address at each
    replay once that tensor died, as long as nothing else is allocated there. The emulated graph
    refused the replay as a read of freed memory before."""
    graph, pool, stream = _kept_pool()
    x = _routed(pool, lambda: torch.ones(FLOATS, device="cuda"))
    address, nbytes = x.untyped_storage().data_ptr(), x.untyped_storage().nbytes()
    reader = torch.cuda.CUDAGraph()
    with torch.cuda.graph(reader, pool=pool, stream=stream):
        y = x * 2
    del x
    memory = torch._C._construct_storage_from_data_pointer(address, torch.device("cuda", 0), nbytes)
    torch.empty(0, device="cuda").set_(memory).fill_(3.0)
    reader.replay()
    torch.cuda.synchronize()
    assert y.tolist() == [6.0] * FLOATS
    del reader, graph


def test_a_restored_checkpoint_allocates_its_blocks_again(pool_kind):
    """getCheckpointState, setCheckpointPoolState: the blocks allocated at the checkpoint are
    allocated again, a storage passed to own one owns it (it has the allocator's deleter), the
    others are held by nothing until raw_delete frees them."""
    graph, pool, _ = _kept_pool()
    a, b = _routed(pool, lambda: (torch.ones(FLOATS, device="cuda"),
                                  torch.ones(FLOATS, device="cuda")))
    state = torch._C._cuda_getCheckpointState(0, pool)
    a_ptr, b_ptr = a.untyped_storage().data_ptr(), b.untyped_storage().data_ptr()
    alias = torch._C._construct_storage_from_data_pointer(a_ptr, torch.device("cuda", 0),
                                                          a.untyped_storage().nbytes())
    del a, b
    assert _live_blocks(pool) == 0
    assert not torch._C._has_Standard_Deleter(alias._cdata)
    torch._C._cuda_setCheckpointPoolState(0, state, [], [alias._cdata])
    assert _live_blocks(pool) == 2
    assert torch._C._has_Standard_Deleter(alias._cdata)
    torch._C._cuda_cudaCachingAllocator_raw_delete(b_ptr)
    assert _live_blocks(pool) == 1
    del alias
    gc.collect()
    assert _live_blocks(pool) == 0
    del graph


def test_a_restored_checkpoint_frees_a_block_allocated_since(pool_kind):
    """setCheckpointPoolState with a block allocated since the checkpoint: its storage is passed
    as stale (CUDA checks that every such block's storage is) and loses the block, whose storage
    frees nothing at its death; the checkpoint's block goes to the storage passed to own it."""
    graph, pool, _ = _kept_pool()
    c = _routed(pool, lambda: torch.ones(FLOATS, device="cuda"))
    state = torch._C._cuda_getCheckpointState(0, pool)
    alias = torch._C._construct_storage_from_data_pointer(
        c.untyped_storage().data_ptr(), torch.device("cuda", 0), c.untyped_storage().nbytes())
    del c
    d = _routed(pool, lambda: torch.ones(FLOATS, device="cuda"))
    torch._C._cuda_setCheckpointPoolState(0, state, [d.untyped_storage()._cdata], [alias._cdata])
    assert _live_blocks(pool) == 1  # the checkpoint's block, now the alias's
    assert not torch._C._has_Standard_Deleter(d.untyped_storage()._cdata)
    del d
    assert _live_blocks(pool) == 1
    del alias
    gc.collect()
    assert _live_blocks(pool) == 0
    del graph


@pytest.mark.skipif(not CAN_MOVE_INTO_POOL, reason=NO_SWAP)
def test_a_storage_that_owns_its_block_is_not_handed_another(cuda_device):
    """setCheckpointPoolState's storages to own a block must own none (CUDA's check, "Not
    expecting deleter function"). (Emulated only: natively the failed call leaves the pool
    restored under storages that still free their blocks.)"""
    graph, pool, _ = _kept_pool()
    c = _routed(pool, lambda: torch.ones(FLOATS, device="cuda"))
    state = torch._C._cuda_getCheckpointState(0, pool)
    with pytest.raises(RuntimeError, match="Not expecting deleter function"):
        torch._C._cuda_setCheckpointPoolState(0, state, [], [c.untyped_storage()._cdata])
    del c, graph


@pytest.mark.skipif(not CAN_MOVE_INTO_POOL, reason=NO_SWAP)
def test_a_block_allocated_since_the_checkpoint_must_be_passed_as_stale(cuda_device):
    """CUDA's check in setCheckpointPoolState: a block allocated now and not at the checkpoint
    belongs to a storage the caller passes as stale. (Emulated only: natively the failed call
    leaves that storage's deleter on a freed block, which its death would free again.)"""
    graph, pool, _ = _kept_pool()
    state = torch._C._cuda_getCheckpointState(0, pool)
    c = _routed(pool, lambda: torch.ones(FLOATS, device="cuda"))
    with pytest.raises(RuntimeError, match="must be passed to set checkpoint"):
        torch._C._cuda_setCheckpointPoolState(0, state, [], [])
    del c, graph


def test_the_pools_live_allocations_are_checked_by_address(pool_kind):
    """checkPoolLiveAllocations: whether the pool's allocated blocks start exactly at the
    addresses given."""
    graph, pool, _ = _kept_pool()
    x = _routed(pool, lambda: torch.ones(FLOATS, device="cuda"))
    address = x.untyped_storage().data_ptr()
    assert torch._C._cuda_checkPoolLiveAllocations(0, pool, {address})
    assert not torch._C._cuda_checkPoolLiveAllocations(0, pool, set())
    assert not torch._C._cuda_checkPoolLiveAllocations(0, pool, {address, address + 4096})
    del x
    assert torch._C._cuda_checkPoolLiveAllocations(0, pool, set())
    del graph


def test_a_storage_made_from_a_pointer_has_no_allocators_deleter(kind):
    """_has_Standard_Deleter: a device tensor's storage owns its allocation; one made from its
    data pointer does not."""
    x = torch.ones(FLOATS, device="cuda")
    alias = torch._C._construct_storage_from_data_pointer(
        x.data_ptr(), torch.device("cuda", 0), x.untyped_storage().nbytes())
    assert torch._C._has_Standard_Deleter(x.untyped_storage()._cdata)
    assert not torch._C._has_Standard_Deleter(alias._cdata)


def test_free_and_remove_deleter_frees_the_allocation_now(kind):
    """_free_And_Remove_DeleterFn: the storage's allocation goes back now, the storage stays (its
    death frees nothing more)."""
    x = torch.empty(256 * FLOATS, device="cuda")
    before = torch.cuda.memory_allocated()
    torch._C._free_And_Remove_DeleterFn(x.untyped_storage()._cdata)
    assert torch.cuda.memory_allocated() == before - x.untyped_storage().nbytes()
    assert not torch._C._has_Standard_Deleter(x.untyped_storage()._cdata)
    del x
    assert torch.cuda.memory_allocated() == before - 256 * FLOATS * 4


def test_a_tensor_is_built_over_a_storage_from_metadata(kind):
    """_construct_CUDA_Tensor_From_Storage_And_Metadata: the metadata's layout over the storage."""
    x = torch.arange(12.0, device="cuda")
    metadata = {"nbytes": 48, "data_ptr": x.data_ptr(), "size": (2, 2), "stride": (4, 1),
                "dtype": torch.float32, "device": x.device, "storage_offset": 1}
    t = torch._C._construct_CUDA_Tensor_From_Storage_And_Metadata(metadata, x.untyped_storage())
    assert t.is_cuda and t.tolist() == [[1.0, 2.0], [5.0, 6.0]]
    t.zero_()
    assert x[1].item() == 0.0


def test_tensors_data_ptrs_are_compared_at_the_indices(kind):
    """_tensors_data_ptrs_at_indices_equal: the tensors at the indices start at the pointers."""
    a, b = torch.ones(4, device="cuda"), torch.ones(4, device="cuda")
    assert torch._C._tensors_data_ptrs_at_indices_equal(
        [a, 3, b], [a.data_ptr(), None, b.data_ptr()], [0, 2])
    assert not torch._C._tensors_data_ptrs_at_indices_equal([a, b], [a.data_ptr(), a.data_ptr()],
                                                            [0, 1])


def test_the_memory_history_is_reported_enabled(kind):
    """_cuda_isHistoryEnabled follows torch.cuda.memory._record_memory_history."""
    assert not torch._C._cuda_isHistoryEnabled()
    torch.cuda.memory._record_memory_history()
    try:
        assert torch._C._cuda_isHistoryEnabled()
    finally:
        torch.cuda.memory._record_memory_history(None)
    assert not torch._C._cuda_isHistoryEnabled()


def test_the_conv_benchmark_cache_flag_is_kept(kind):
    """_cuda_get_conv_benchmark_empty_cache / _cudnn_set_conv_benchmark_empty_cache."""
    assert torch._C._cuda_get_conv_benchmark_empty_cache()
    torch._C._cudnn_set_conv_benchmark_empty_cache(False)
    try:
        assert not torch._C._cuda_get_conv_benchmark_empty_cache()
    finally:
        torch._C._cudnn_set_conv_benchmark_empty_cache(True)


# What the trees call on their outputs and only a CUDA build of torch defines (a CPU wheel lacks
# it), and the storage swap that moves an allocation into a graph pool (torch 2.11 lacks it)
TREES_MISSING = [name for name in ("_set_storage_access_error_msg",
                                   "_set_storage_data_ptr_access_error_msg")
                 if not hasattr(torch._C, name)] + (
    [] if CAN_MOVE_INTO_POOL else ["UntypedStorage._swap_data_ptr_"])
needs_trees_pieces = pytest.mark.skipif(
    bool(TREES_MISSING), reason=f"this torch lacks {TREES_MISSING}, which cudagraph trees call")


@needs_trees_pieces
def test_torchs_trees_checkpoint_around_an_output_that_died(kind):
    """PyTorch's test_tensor_dies_between_checkpoint: a second function recorded after an output
    of the first died checkpoints the pool once; the dead output's block goes back, the live
    one's with its tensor. Refused by name on the emulated device until 2026-12-07."""
    from torch._inductor import config
    from torch._inductor.cudagraph_trees import cudagraphify_impl, get_container

    def run(fn, inputs):
        return cudagraphify_impl(fn, inputs, (), device_index=0, is_inference=True,
                                 is_backward=False)

    def foo(args):
        x = args[0]
        args.clear()
        return x + 1, x + 2

    def foo2(args):
        x = args[0]
        args.clear()
        return [x * x * x]

    torch._dynamo.reset()
    try:
        with config.patch({"triton.skip_cudagraph_warmup": True,
                           "triton.slow_path_cudagraph_asserts": True}):
            inp = torch.rand([4], device="cuda")
            foo_cg = run(foo, [inp])
            foo_cg([inp]), foo_cg([inp])
            out1, out2 = foo_cg([inp])
            expected = out1 * out1 * out1
            inp = [out1]
            del out1, out2
            manager = get_container(0).tree_manager
            pool = manager.cuda_graphs_thread_pool
            x = run(foo2, inp)(inp)[0]
            assert manager.debug_checkpointing_counter == 1
            torch.testing.assert_close(x, expected)
            assert _live_blocks(pool) == 1
            del x
            assert _live_blocks(pool) == 0
    finally:
        torch._dynamo.reset()


@pytest.mark.skipif(not TREES_MISSING, reason="this torch has what the trees call")
def test_trees_are_refused_by_name_where_the_build_lacks_a_piece(cuda_device):
    """A CPU wheel lacks the storage access-error calls the trees make on their outputs: driving
    the trees is refused naming the torch version and the missing calls."""
    from torch._inductor import cudagraph_trees

    def model(inputs):
        (t,) = inputs
        inputs.clear()
        return (t + 1,)

    with pytest.raises(UnsupportedOnEmulatedDevice, match=torch.__version__.replace("+", r"\+")):
        cudagraph_trees.cudagraphify_impl(model, [torch.rand(4, device="cuda")], (),
                                          device_index=0, is_backward=False, is_inference=True)


@pytest.mark.skipif(CAN_MOVE_INTO_POOL, reason="this torch has the storage swap")
def test_checkpoints_are_refused_by_name_without_the_storage_swap(cuda_device):
    """torch 2.11: a graph pool's checkpoint is refused naming the torch version and the swap."""
    graph, pool, _ = _kept_pool()
    with pytest.raises(UnsupportedOnEmulatedDevice, match="_swap_data_ptr_"):
        torch._C._cuda_getCheckpointState(0, pool)
    del graph
