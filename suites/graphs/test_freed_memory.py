"""Memory a graph does not own, freed after capture (a workspace regrown, a weight dropped). A CUDA
graph keeps the address, not the buffer: the next allocation of that size gets the address and
replay writes into it, or reads it. The emulator refuses such a replay with FreedMemoryError; the
cuda column shows the clobbering it stands for."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import CaptureError, FreedMemoryError

# 16 MiB of float32: CUDA's caching allocator gives a block this large a segment of its own (a
# multiple of 2 MiB), so a freed one merges with no neighbour and the next allocation of its size
# gets its address back.
N = 4 << 20


def _reallocated_at(backend, address: int, value: float) -> torch.Tensor:
    fresh = torch.full((N,), value, device=backend.device)
    if backend.name == "cuda" and fresh.data_ptr() != address:
        pytest.fail(f"the caching allocator did not hand the freed address {address:#x} to the next "
                    f"allocation of its size (got {fresh.data_ptr():#x})")
    return fresh


def test_replay_writes_into_a_buffer_freed_after_capture(backend):
    workspace = torch.zeros(N, device=backend.device)
    source = torch.full((N,), 2.0, device=backend.device)

    def step() -> None:
        workspace.copy_(source)  # returns nothing: graph.output must not hold the workspace

    graph = backend.capture(step)
    address = workspace.data_ptr()
    del workspace  # the workspace regrows: its old buffer is dropped
    fresh = _reallocated_at(backend, address, 5.0)
    if backend.name == "cuda":
        graph.replay()
        backend.synchronize()
        assert torch.equal(fresh, torch.full((N,), 2.0, device=backend.device))  # clobbered
        return
    with pytest.raises(FreedMemoryError) as caught:
        graph.replay()
    message = str(caught.value)
    assert f"shape ({N},), torch.float32" in message
    assert "test_freed_memory.py" in message and "workspace.copy_(source)" in message
    assert "freed after capture" in message and "recapture" in message
    assert isinstance(caught.value, CaptureError)
    assert torch.equal(fresh, torch.full((N,), 5.0, device=backend.device))  # never written


def test_replay_reads_a_weight_freed_after_capture(backend):
    weight = torch.ones(N, device=backend.device)
    graph = backend.capture(lambda: weight.sum())
    address = weight.data_ptr()
    del weight
    fresh = _reallocated_at(backend, address, 3.0)
    if backend.name == "cuda":
        graph.replay()
        backend.synchronize()
        assert graph.output.item() == 3.0 * N  # the new owner's values
        return
    with pytest.raises(FreedMemoryError, match=r"freed after capture"):
        graph.replay()
    assert fresh.sum().item() == 3.0 * N


def test_a_buffer_kept_alive_by_a_view_is_not_freed(backend):
    workspace = torch.zeros(N, device=backend.device)
    graph = backend.capture(lambda: workspace.fill_(4.0).sum())
    head = workspace[:8]  # holds the storage
    del workspace
    graph.replay()
    backend.synchronize()
    assert torch.equal(head, torch.full((8,), 4.0, device=backend.device))


def test_a_model_whose_workspace_regrows_after_capture(backend):
    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)
            self.workspace = torch.zeros(N, device=backend.device)

        def forward(self, x):
            self.workspace[: x.numel()].copy_(x.flatten())
            return self.linear(self.workspace[: x.numel()].view_as(x))

    torch.manual_seed(0)
    model = Scaled().to(backend.device)
    x = torch.randn(4, 8, device=backend.device)
    with torch.no_grad():
        graph = backend.capture(lambda: model(x))
        address = model.workspace.data_ptr()
        model.workspace = torch.zeros(2 * N, device=backend.device)  # regrown for a larger shape
        fresh = _reallocated_at(backend, address, 5.0)
        if backend.name == "cuda":
            graph.replay()
            backend.synchronize()
            assert torch.equal(fresh[: x.numel()], x.flatten())  # the step wrote into the new owner
            return
        with pytest.raises(FreedMemoryError, match=rf"shape \(32,\), torch.float32 \(on a storage of {4 * N} bytes\)"):
            graph.replay()


def test_a_workspace_grown_in_place_with_resize_after_capture(backend):
    """resize_() keeps the storage object and moves its bytes: the freed-memory check alone never
    fires, and replay would write into the freed old memory."""
    workspace = torch.zeros(N, device=backend.device)
    source = torch.full((N,), 2.0, device=backend.device)

    def step() -> None:
        workspace.copy_(source)

    graph = backend.capture(step)
    address = workspace.data_ptr()
    workspace.resize_(2 * N)  # grown in place for a larger shape
    if backend.name == "cuda":
        assert workspace.data_ptr() != address  # the captured address is freed memory now
        return  # replaying would be undefined behaviour: nothing to show safely
    with pytest.raises(FreedMemoryError) as caught:
        graph.replay()
    message = str(caught.value)
    assert "resize_()" in message and "moved after capture" in message
    assert f"shape ({N},), torch.float32" in message
    assert f"from {4 * N} to {8 * N} bytes" in message and f"{address:#x}" in message
    assert "workspace.copy_(source)" in message  # the capture's first use


def test_a_small_resize_that_keeps_the_memory_replays(backend):
    workspace = torch.zeros(64, device=backend.device)

    def step() -> None:
        workspace.fill_(3.0)

    graph = backend.capture(step)
    workspace.resize_(8)  # shrinking keeps the allocation
    graph.replay()
    backend.synchronize()
    assert torch.equal(workspace, torch.full((8,), 3.0, device=backend.device))


def test_set_after_capture_names_the_line_that_moved_the_tensor(backend):
    workspace = torch.zeros(N, device=backend.device)

    def step() -> None:
        workspace.fill_(1.0)

    graph = backend.capture(step)
    workspace.set_(torch.zeros(2 * N, device=backend.device).untyped_storage())  # the moving call
    if backend.name == "cuda":
        return  # the captured address is freed memory: replaying would be undefined behaviour
    with pytest.raises(FreedMemoryError) as caught:
        graph.replay()
    message = str(caught.value)
    assert "test_freed_memory.py" in message and "workspace.set_(" in message
    assert "set_() or `.data = ...`" in message and f"shape ({2 * N},)" in message


def _graphs_sharing_a_workspace(backend, *, allocate_inside: bool, same_pool: bool = False):
    """Graph A and graph B use one per-stream workspace; A's capture allocates it first when
    `allocate_inside` (so A's private pool owns it), else it exists before either capture."""
    workspaces = {} if allocate_inside else {"ws": torch.zeros(4, device=backend.device)}
    x = workspaces["x"] = torch.ones(4, device=backend.device)

    def step_a():
        if "ws" not in workspaces:
            workspaces["ws"] = torch.zeros(4, device=backend.device)
        workspaces["ws"].copy_(x)

    def step_b():
        workspaces["ws"].add_(x)

    a = backend.capture(step_a)
    b = backend.capture(step_b, pool=a.pool if same_pool else None)
    a.replay()
    b.replay()
    backend.synchronize()
    assert torch.equal(workspaces["ws"], torch.full((4,), 2.0, device=backend.device))
    return a, b, workspaces


def test_replay_into_memory_freed_with_another_graphs_pool_is_refused(backend):
    # The workspace came from A's pool; A is evicted with it (TensorRT-LLM's LRU of graphs and
    # their workspaces): B would replay into memory the allocator may hand to anyone.
    a, b, workspaces = _graphs_sharing_a_workspace(backend, allocate_inside=True)
    a.reset()
    del workspaces["ws"]
    torch.cuda.empty_cache()  # CUDA hands a released pool's addresses out from here on
    with pytest.raises(FreedMemoryError, match="another graph"):
        b.replay()


def test_memory_of_a_held_pool_stays_readable_by_another_graph_after_its_last_tensor_drops(backend):
    # CUDA keeps a freed block of a private pool for later captures into that pool while a graph
    # holding it lives, so B still reads what A's replay wrote (PyTorch's test_graph_two_successive:
    # g1 reads g0's output, freed during g1's capture). A's reset then frees it: refused.
    a, b, workspaces = _graphs_sharing_a_workspace(backend, allocate_inside=True)
    del workspaces["ws"]
    a.replay()
    b.replay()
    a.replay()
    b.replay()
    backend.synchronize()
    a.reset()
    torch.cuda.empty_cache()
    with pytest.raises(FreedMemoryError, match="another graph"):
        b.replay()


def test_an_output_freed_during_the_next_capture_is_read_by_that_graph(backend):
    # test_graph_two_successive's "Don't share" case: g0 (its own pool) makes b, g1 (its own pool)
    # reads b and drops it during its capture.
    x = torch.ones(4, device=backend.device)
    held = {}

    def first():
        held["b"] = x * 2

    def second():
        held["c"] = held.pop("b") + 1

    g0 = backend.capture(first)
    g1 = backend.capture(second)
    x.fill_(3.0)
    g0.replay()
    g1.replay()
    backend.synchronize()
    assert held["c"].tolist() == [7.0] * 4


def test_a_workspace_allocated_outside_the_captures_outlives_either_graph(backend):
    a, b, workspaces = _graphs_sharing_a_workspace(backend, allocate_inside=False)
    a.reset()
    b.replay()
    backend.synchronize()
    assert torch.equal(workspaces["ws"], torch.full((4,), 3.0, device=backend.device))


def test_graphs_of_one_pool_may_use_each_others_memory(backend):
    # One pool shared by both graphs: CUDA keeps its memory for B after A's reset (the pattern of
    # piecewise runners that hold their pieces' outputs weakly).
    a, b, workspaces = _graphs_sharing_a_workspace(backend, allocate_inside=True, same_pool=True)
    a.reset()
    b.replay()
    backend.synchronize()
