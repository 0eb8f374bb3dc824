"""Sleep mode under live graphs: the weights live in a `torch.cuda.MemPool` of their own (the pool
a sleep mode can give back), the decode graph is captured reading them; sleep drops the weights and
frees the pool's memory, wake reloads them into new tensors (vLLM #55013, EAGLE3 + sleep level 2:
illegal memory access at the draft graph's replay after wake:
https://github.com/vllm-project/vllm/issues/55013; SGLang #27140, memory freed or remapped under
live graphs by the memory saver: https://github.com/sgl-project/sglang/pull/27140). The graph still
holds the old addresses: on CUDA the replay reads unmapped memory (an illegal memory access) or
whatever took the address; the harness refuses it, naming the capture's line and the line that
dropped the weights. Fixed: wake copies the weights back into the tensors the graph captured (the
storage kept, as vLLM's cumem allocator keeps the virtual addresses), or the runtime recaptures its
graphs after wake (https://github.com/vllm-project/vllm/pull/45648)."""

from __future__ import annotations

import gc

import pytest
import torch

from harness.graphs import FreedMemoryError


class SleepingRunner:
    def __init__(self) -> None:
        self.weights_pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(self.weights_pool):
            self.weight = torch.full((1024,), 2.0, device="cuda")
        self.x = torch.ones(1024, device="cuda")
        self.out = torch.zeros(1024, device="cuda")
        self.capture()

    def capture(self) -> None:
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out.copy_(self.x * self.weight)

    def sleep(self) -> None:
        self.weight = None  # level 2: the weights are dropped, reloaded at wake
        self.weights_pool = None  # and their pool with its memory
        gc.collect()
        torch.cuda.empty_cache()

    def wake_by_reallocating(self, new_value: float) -> None:
        self.weights_pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(self.weights_pool):
            self.weight = torch.full((1024,), new_value, device="cuda")

    def step(self) -> list[float]:
        self.graph.replay()
        return self.out[:2].tolist()


def test_a_replay_after_wake_reallocated_the_weights_is_refused():
    runner = SleepingRunner()
    assert runner.step() == [2.0, 2.0]
    runner.sleep()
    runner.wake_by_reallocating(3.0)
    with pytest.raises(FreedMemoryError, match="freed after capture") as caught:
        runner.step()
    message = str(caught.value)
    assert "self.out.copy_(self.x * self.weight)" in message  # the capture's read
    assert "self.weight = None" in message  # the sleep that dropped the weights


def test_weights_copied_back_into_the_captured_tensors_replay_the_new_values():
    runner = SleepingRunner()
    runner.step()
    runner.weight.copy_(torch.full((1024,), 3.0))  # wake: same storage, reloaded values
    assert runner.step() == [3.0, 3.0]


def test_graphs_recaptured_after_wake_replay_the_new_weights():
    runner = SleepingRunner()
    runner.step()
    runner.sleep()
    runner.wake_by_reallocating(3.0)
    runner.capture()
    assert runner.step() == [3.0, 3.0]
