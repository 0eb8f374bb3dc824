"""Threads started inside the emulation see the same emulated device: their "cuda" tensors are
device tensors and their ops are placed and heard as the main thread's (torch keeps its mode
stacks per thread, so without the emulation's help a thread would see a plain cpu)."""

from __future__ import annotations

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
