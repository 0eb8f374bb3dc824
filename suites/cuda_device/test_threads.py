"""Threads started inside the emulation see the same emulated device: their "cuda" tensors are
device tensors and their ops are placed and heard as the main thread's (torch keeps its mode
stacks per thread, so without the emulation's help a thread would see a plain cpu)."""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import harness


def _made_on_the_device() -> tuple[bool, str, str]:
    t = torch.ones(3, device="cuda")
    y = t * 2
    return t.is_cuda, str(t.device), y.device.type


def test_a_thread_makes_device_tensors(cuda_device):
    results = []
    worker = threading.Thread(target=lambda: results.append(_made_on_the_device()))
    worker.start()
    worker.join()
    assert results == [(True, "cuda:0", "cuda")]


def test_a_thread_subclass_with_its_own_run_makes_device_tensors(cuda_device):
    class Worker(threading.Thread):
        result = None

        def run(self) -> None:
            self.result = _made_on_the_device()

    worker = Worker()
    worker.start()
    worker.join()
    assert worker.result == (True, "cuda:0", "cuda")


def test_a_thread_pool_makes_device_tensors_and_mixes_with_the_main_threads(cuda_device):
    x = torch.ones(3, device="cuda")
    with ThreadPoolExecutor(max_workers=2) as pool:
        made = pool.submit(_made_on_the_device).result()
        summed = pool.submit(lambda: x + torch.ones(3, device="cuda")).result()
    assert made == (True, "cuda:0", "cuda")
    assert summed.is_cuda and summed.tolist() == [2.0] * 3


def test_a_threads_device_ops_are_heard_with_their_thread(cuda_device):
    heard: list[int] = []

    class Listener:
        def on_op(self, op, args, kwargs, result, stream) -> None:
            heard.append(threading.get_ident())

    x = torch.ones(3, device="cuda")
    idents: list[int] = []

    def work() -> None:
        idents.append(threading.get_ident())
        x.mul_(2)

    with cuda_device.observe(Listener()):
        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
    assert idents and idents[0] in heard


def test_a_threads_host_tensor_mixed_with_a_device_tensor_raises_cudas_error(cuda_device):
    x = torch.ones(3, device="cuda")
    errors: list[str] = []

    def mix() -> None:
        try:
            x + torch.ones(3)
        except RuntimeError as error:
            errors.append(str(error))

    worker = threading.Thread(target=mix)
    worker.start()
    worker.join()
    assert errors and "Expected all tensors to be on the same device" in errors[0]


@contextlib.contextmanager
def _pause_inside_the_op(inside: threading.Event, resume: threading.Event):
    """Holds the first op of the block that saves a tensor for backward, once inside the device
    op (autograd's pack hook runs there): it tells `inside` and goes on when `resume` is set
    (another thread's work interleaves there). The hooks are this thread's own."""
    held = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if not held:
            held.append(True)
            inside.set()
            if not resume.wait(30):
                raise TimeoutError("the other thread never let this op go on")
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield


def _overlap_streams() -> None:
    """Side-stream work first: the device tracks its streams from then on (so does a runtime's)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.ones(4, device="cuda").add_(1)
    torch.cuda.current_stream().wait_stream(side)


def test_a_host_tensor_made_while_another_thread_runs_a_device_op_is_host_memory(cuda_kind):
    # An overlap scheduler's host thread builds the next batch on the cpu while the main thread
    # launches the forward: its tensors are host tensors, whatever the other thread runs.
    _overlap_streams()
    x = torch.ones(4, device="cuda", requires_grad=True)
    inside, made = threading.Event(), threading.Event()
    host: list[torch.Tensor] = []

    def build_batch() -> None:
        inside.wait(30)
        host.append(torch.arange(3))
        made.set()

    worker = threading.Thread(target=build_batch)
    worker.start()
    with _pause_inside_the_op(inside, made):
        x.sin()
    worker.join()
    assert host[0].device.type == "cpu" and host[0].numpy().tolist() == [0, 1, 2]


def test_overlapping_device_ops_of_two_threads_leave_host_factories_on_the_host(cuda_kind):
    # The worker's op begins first and ends while the main thread's op is still running.
    _overlap_streams()
    x = torch.ones(4, device="cuda", requires_grad=True)
    worker_inside, main_inside, worker_done = (threading.Event(), threading.Event(),
                                               threading.Event())

    def forward() -> None:
        with _pause_inside_the_op(worker_inside, main_inside):
            x.sin()
        worker_done.set()

    worker = threading.Thread(target=forward)
    worker.start()
    worker_inside.wait(30)
    with _pause_inside_the_op(main_inside, worker_done):
        x.cos()
    worker.join()
    assert torch.zeros(2).device.type == "cpu"
    assert not torch.empty(2, pin_memory=True).is_cuda


def test_leaving_the_emulation_gives_threads_back_as_they_were(outside_emulation):
    start = threading.Thread.start
    with harness.emulate_cuda(device="cpu"):
        assert threading.Thread.start is not start
    assert threading.Thread.start is start
    results = []
    worker = threading.Thread(target=lambda: results.append(torch.ones(1).is_cuda))
    worker.start()
    worker.join()
    assert results == [False]
