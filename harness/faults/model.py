"""Faults planted in the reference model: its weights and its scratch memory (harness.model)."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from harness.faults.patching import replace_function, replace_method
from harness.faults.registry import Fault, FaultHandle
from harness.model import weights
from harness.model.llama import ReferenceLlama


@contextlib.contextmanager
def weights_rebound_after_capture(handle: FaultHandle) -> Iterator[None]:
    def make(copy_into):
        def planted(param, new):
            handle.fire()
            param.data = new.clone()  # the parameter object stays; its storage moves
        return planted

    with replace_function(weights, "copy_into", make):
        yield


@contextlib.contextmanager
def captured_buffer_freed(handle: FaultHandle) -> Iterator[None]:
    def make(forward):
        def planted(self, input_ids, metadata, kv_cache):
            logits = forward(self, input_ids, metadata, kv_cache)
            handle.fire()
            # Scratch released after every step to save memory (a fresh buffer of the same size
            # takes its place): a graph captured in an earlier step still holds the old address.
            self.workspace.tensor = torch.empty_like(self.workspace.tensor)
            return logits
        return planted

    with replace_method(ReferenceLlama, "forward", make):
        yield


MODEL_FAULTS = (
    Fault(
        name="weights-rebound-after-capture",
        bug_class="weights reloaded after capture by rebinding (`param.data = new`, as an RL weight "
                  "sync does) instead of copying into them; the graph keeps the old weights",
        link="https://github.com/vllm-project/vllm/pull/40390",
        detector="suites/model/test_capturable.py::test_weights_reloaded_after_capture_reach_the_graph",
        expected=r"\d+ parameters moved by the reload",
        plant=weights_rebound_after_capture,
    ),
    Fault(
        name="captured-buffer-freed",
        bug_class="a buffer a graph captured (the attention scratch) is freed after capture and its "
                  "address handed to a new tensor",
        link="https://github.com/pytorch/pytorch/pull/174649",
        # Strict mode: on CUDA the freed scratch is written before it is read at every replay, so
        # tokens stay right until a live tensor takes the address; the moved pointer shows at once.
        detector="suites/decoder/test_strict.py::test_strict_mode_passes_when_nothing_moved",
        expected=r"memory was freed after capture: the tensor of [^{]|workspace\.tensor: data pointer changed from 0x",
        plant=captured_buffer_freed,
    ),
)
