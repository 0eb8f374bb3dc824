"""Rank agreement: `allgather_object` and `barrier` over torch.distributed, or trivial in one process.

The decoder graph manager asks every rank the same questions (try the single pass? did a tensor
move? which shapes can you build?) and acts on the gathered answers, so all ranks take the same path
and none waits in a collective that its peers skip.
"""

from __future__ import annotations

import datetime
import time
from typing import Any, Protocol

import torch
import torch.distributed as dist


class Comm(Protocol):
    rank: int
    world_size: int

    def allgather_object(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order."""

    def barrier(self) -> None:
        """Return once every rank has called it."""


class SingleProcessComm:
    """One rank: gathering returns the rank's own answer, the barrier returns at once."""

    rank = 0
    world_size = 1

    def allgather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def barrier(self) -> None:
        return None


def process_group_backend(device: torch.device | str) -> str:
    """The torch.distributed backend for tensors on `device`: nccl for cuda, gloo otherwise, and
    gloo for the emulated CUDA device's tensors (host memory, which NCCL cannot carry)."""
    from harness.emulation import emulation_active

    if torch.device(device).type != "cuda" or emulation_active() == "cpu":
        return "gloo"
    return "nccl"


class TorchDistributedComm:
    """The default process group. `device` is where this rank's tensors live: nccl collectives
    need the rank's cuda device current, gloo ones run on the CPU."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("TorchDistributedComm needs an initialized default process group "
                               "(torch.distributed.init_process_group); use SingleProcessComm for one "
                               "process")
        self.device = torch.device(device)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        backend = dist.get_backend()
        wanted = process_group_backend(self.device)
        if backend != wanted:
            raise ValueError(f"process group backend {backend!r} does not carry tensors on "
                             f"{self.device}; initialize it with {wanted!r}")

    def allgather_object(self, obj: Any) -> list[Any]:
        gathered: list[Any] = [None] * self.world_size
        if self.device.type == "cuda":
            with torch.cuda.device(self.device):
                dist.all_gather_object(gathered, obj)
        else:
            dist.all_gather_object(gathered, obj)
        return gathered

    def barrier(self) -> None:
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index if self.device.index is not None
                                     else torch.cuda.current_device()])
        else:
            dist.barrier()


def default_comm(device: torch.device | str = "cpu") -> Comm:
    """TorchDistributedComm when a process group is up, else SingleProcessComm."""
    if dist.is_available() and dist.is_initialized():
        return TorchDistributedComm(device)
    return SingleProcessComm()


class GraphDisagreementError(RuntimeError):
    """Ranks about to replay different graphs: a collective captured in one would wait for a peer
    that replays another (a hang), or pair up with a different collective (wrong results).
    `keys` holds each rank's graph key, in rank order."""

    def __init__(self, keys: list[str], step: object = None) -> None:
        at = f" at step {step}" if step is not None else ""
        by_rank = ", ".join(f"rank {rank}: {key}" for rank, key in enumerate(keys))
        super().__init__(
            f"ranks lined up at different graphs{at} ({by_rank}); a collective captured in a graph "
            f"needs every rank to replay the same graph. Decide the graph from values all ranks "
            f"share (gather the batch sizes first, then choose), not from a rank's local count")
        self.keys = keys
        self.step = step


def agree_on_graph(key: object, comm: Comm | None = None, *, step: object = None) -> None:
    """Before replaying a graph with a collective in it: check that every rank replays the same one.

    `key` names the graph this rank is about to replay (its `str` is compared); `comm` defaults to
    `default_comm()`. Every rank raises `GraphDisagreementError` naming each rank's key when they
    differ, so the disagreement surfaces at once instead of as a collective that never completes.
    Call it at the same point on every rank: it is one collective itself."""
    comm = comm if comm is not None else default_comm()
    keys = [str(k) for k in comm.allgather_object(str(key))]
    if len(set(keys)) != 1:
        raise GraphDisagreementError(keys, step)


class GraphKeyTimeoutError(RuntimeError):
    """A rank waited for its peers' graph keys past the timeout: some rank never reached the
    agreement point (it took another path, or waits in another collective). `key` is this rank's."""

    def __init__(self, rank: int, key: str, timeout: datetime.timedelta, step: object = None) -> None:
        at = f" at step {step}" if step is not None else ""
        super().__init__(
            f"rank {rank} chose graph {key!r}{at} and waited {timeout.total_seconds():g} s for the "
            f"other ranks' graph keys: at least one rank never reached agree_on_graph_key (it took "
            f"another path, or waits in another collective). Call agree_on_graph_key at the same "
            f"point on every rank, before the graph's collectives")
        self.rank, self.key, self.timeout, self.step = rank, key, timeout, step


def agree_on_graph_key(key: object, *, group: "dist.ProcessGroup | None" = None,
                       timeout: datetime.timedelta = datetime.timedelta(seconds=60),
                       step: object = None) -> None:
    """Any runtime's check, before a graph with a collective in it replays (or an eager step with
    one runs): every rank of `group` (default: the whole world) must have chosen the same graph.

    `key` is this rank's graph key; its `str` is compared. The keys are all-gathered as text over
    `group`'s own backend (gloo on CPU tensors, nccl on this rank's current cuda device), each
    gather waited for at most `timeout`. Where the keys differ every rank raises
    `GraphDisagreementError` listing the key each rank chose, instead of entering mismatched
    collectives that hang; a rank whose peers do not arrive in time raises `GraphKeyTimeoutError`.
    Without an initialized process group there is one rank, which agrees with itself."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    text = str(key).encode()
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    device = (torch.device("cuda", torch.cuda.current_device())
              if dist.get_backend(group) == "nccl" else torch.device("cpu"))
    deadline = time.monotonic() + timeout.total_seconds()

    def gather(tensor: torch.Tensor) -> list[torch.Tensor]:
        parts = [torch.empty_like(tensor) for _ in range(world)]
        work = dist.all_gather(parts, tensor, group=group, async_op=True)
        while not work.is_completed():
            if time.monotonic() > deadline:
                raise GraphKeyTimeoutError(rank, str(key), timeout, step)
            time.sleep(0.001)  # a host poll; the collective runs in the backend's own threads
        work.wait()
        return parts

    lengths = gather(torch.tensor([len(text)], dtype=torch.int64, device=device))
    longest = max(1, max(int(n.item()) for n in lengths))
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[:len(text)] = torch.tensor(list(text), dtype=torch.uint8)
    keys = [bytes(part.cpu()[:int(n.item())].tolist()).decode(errors="replace")
            for part, n in zip(gather(padded.to(device)), lengths)]
    if len(set(keys)) != 1:
        raise GraphDisagreementError(keys, step)
