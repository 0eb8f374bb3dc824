"""A GEMM workspace cached per thread, and a graph captured on a short-lived worker thread (PyTorch
#192061: cuBLAS workspaces made thread-local while vLLM's dual-batch-overlap captures on worker
threads; "The worker exits, freeing its thread-local cuBLAS workspace. The graph retains the
now-stale workspace address", and replays faulted inside cuBLAS, accuracy 0). The worker warms up,
which allocates its workspace, then captures; when it exits its thread-local storage goes, and the
workspace's memory with it. The next allocation of that size takes the address the graph still
writes. The harness refuses the replay, naming the capture's first use of the workspace. Fixed: the
runner keeps each workspace a capture used as long as the graph (what PyTorch #193046 does, a
reference stashed in the graph)."""

from __future__ import annotations

import threading

import pytest
import torch

from harness.graphs import FreedMemoryError

WORKSPACE = 1 << 12
_per_thread = threading.local()


def _workspace() -> torch.Tensor:
    """The calling thread's GEMM workspace, made at its first GEMM (a library's handle pool)."""
    workspace = getattr(_per_thread, "workspace", None)
    if workspace is None:
        workspace = _per_thread.workspace = torch.zeros(WORKSPACE, device="cuda")
    return workspace


def gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """`out = a @ b` through a split-K partial sum in the workspace."""
    partial = _workspace()[: out.numel()].view_as(out)
    partial.copy_(a[:, :2] @ b[:2])
    out.copy_(partial + a[:, 2:] @ b[2:])


class MicroBatchRunner:
    """Captures its decode step on a worker thread, as a dual-batch-overlap runner does."""

    def __init__(self, *, keep_workspaces: bool) -> None:
        self.a = torch.ones(4, 4, device="cuda")
        self.b = torch.eye(4, device="cuda")
        self.out = torch.zeros(4, 4, device="cuda")
        self.graph = torch.cuda.CUDAGraph()
        self.kept: list[torch.Tensor] = []
        self.failed: BaseException | None = None
        worker = threading.Thread(target=self._capture, args=(keep_workspaces,))
        worker.start()
        worker.join()
        if self.failed is not None:
            raise self.failed

    def _capture(self, keep_workspaces: bool) -> None:
        try:
            gemm(self.a, self.b, self.out)  # warmup: the thread's workspace is made here
            torch.cuda.synchronize()
            with torch.cuda.graph(self.graph):
                gemm(self.a, self.b, self.out)
            if keep_workspaces:
                self.kept.append(_workspace())
        except BaseException as error:  # noqa: BLE001 - handed to the constructing thread
            self.failed = error

    def step(self, a: torch.Tensor) -> list[list[float]]:
        self.a.copy_(a)
        self.graph.replay()
        return self.out.tolist()


def test_a_replay_after_the_capturing_thread_exited_is_refused():
    runner = MicroBatchRunner(keep_workspaces=False)
    torch.full((WORKSPACE,), 7.0, device="cuda")  # the next allocation of its size
    with pytest.raises(FreedMemoryError, match="test_workspace_of_a_capturing_thread.py"):
        runner.step(torch.full((4, 4), 2.0, device="cuda"))


def test_a_workspace_kept_with_the_graph_replays():
    runner = MicroBatchRunner(keep_workspaces=True)
    torch.full((WORKSPACE,), 7.0, device="cuda")
    a = torch.arange(16, dtype=torch.float32, device="cuda").view(4, 4)
    assert runner.step(a) == a.tolist()  # a @ I
