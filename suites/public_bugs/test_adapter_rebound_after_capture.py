"""A LoRA adapter switched by rebinding the runner's attribute to another adapter's weights after
the decode graph was captured (vLLM #47725: a memo skipped the metadata update; SGLang #26930:
stale adapter buffers under CUDA graphs). The graph keeps reading the captured adapter, which is
the adapter table's own tensor and still alive there, so nothing is freed and the replay silently
applies the old adapter: the output differs from the eager step's, and `moved_tensors` names the
rebound attribute. Fixed: copy the new adapter's weights into a slot of the runner's own."""

from __future__ import annotations

import torch

from harness.check import describe_moved, moved_tensors, snapshot_tensors


class LoraRunner:
    def __init__(self, *, own_slot: bool) -> None:
        self.adapters = {name: torch.full((8, 8), scale, device="cuda")
                         for name, scale in (("base", 0.0), ("french", 1.0), ("code", 2.0))}
        # What the graph reads: the table's own tensor (buggy), or a slot of the runner's own.
        french = self.adapters["french"]
        self.lora_b = french.clone() if own_slot else french
        self.x = torch.ones(1, 8, device="cuda")
        self.out = torch.zeros(1, 8, device="cuda")
        self.graph = torch.cuda.CUDAGraph()
        self._step()  # warm up, as runtimes do: CUDA refuses a thread's first matmul in a capture
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph):
            self._step()

    def _step(self) -> None:
        self.out.copy_(self.x + self.x @ self.lora_b)

    def switch_buggy(self, name: str) -> None:
        self.lora_b = self.adapters[name]

    def switch_fixed(self, name: str) -> None:
        self.lora_b.copy_(self.adapters[name])

    def eager(self) -> list[float]:
        return (self.x + self.x @ self.lora_b)[0].tolist()

    def replay(self) -> list[float]:
        self.graph.replay()
        return self.out[0].tolist()


def test_a_rebound_adapter_is_named_and_the_replay_keeps_the_old_one():
    runner = LoraRunner(own_slot=False)
    before = snapshot_tensors(runner, "runner")
    runner.switch_buggy("code")
    after = snapshot_tensors(runner, "runner")
    assert moved_tensors(before, after) == ["runner.lora_b"]
    assert "data pointer changed" in describe_moved(before, after)
    assert runner.replay() != runner.eager()  # 9.0 (the captured adapter) where eager gives 17.0
    assert runner.replay() == [9.0] * 8


def test_an_adapter_copied_into_the_slot_replays_as_eager():
    runner = LoraRunner(own_slot=True)
    before = snapshot_tensors(runner, "runner")
    runner.switch_fixed("code")
    assert moved_tensors(before, snapshot_tensors(runner, "runner")) == []
    assert runner.replay() == runner.eager() == [17.0] * 8
