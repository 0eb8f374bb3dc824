"""CUDAGraph's conditional-node calls on the emulated device (and the graph sanitizer): CUDA 12.4's
if and while nodes, which torch.cond and torch.while_loop become inside a capture
(torch/_higher_order_ops/cudagraph_conditional_nodes.py, pushed by cudagraph trees) and which code
may call directly. The recording holds the node (graphs/emulator/conditional.py); this is the
graph's side: CUDAGraph.cpp's checks, in torch's words, and what ends the capture with an error.

Each build has the calls its CUDAGraph binds, no more: `begin_capture_to_if_node` and
`end_capture_to_conditional_node` since torch 2.13 (torch 2.11 has neither: the attribute is
missing there, as natively), `begin_capture_to_while_node` and
`set_conditional_handle_for_current_node` since 2.14. `ConditionalNodeCalls` is the mixin of the
emulated `_CUDAGraph` with those of this build; it uses the graph's `_host` (its `memory` and
`is_current_stream_capturing()`), `_session` (the capture in progress), `_instantiated` and
`_capture_error` (what `capture_end()` raises again, cuda_graph.py).

Different from CUDA: the body's ops are recorded on the stream current when the node began;
CUDA captures them on a new stream it makes current until the node ends (so
`torch.cuda.current_stream()` inside the body names another stream there).
"""

from __future__ import annotations

import torch

from harness import torch_internals
from harness.graphs.base import CaptureError
from harness.graphs.emulator.opinfo import scalar_type_name

# CUDAGraph::end_capture_to_conditional_node: a body that drew from a generator (its capture made
# a capture state for the body's capture id) fails, and so does the capture's end.
RNG_IN_BODY = "RNG within data-dependent conditional nodes is not supported yet."


class _AllConditionalNodeCalls:
    def begin_capture_to_if_node(self, scalar_cuda_pred_tensor) -> None:
        """Capture what follows, until `end_capture_to_conditional_node()`, into an if node: at
        each replay it runs when `scalar_cuda_pred_tensor` (a device bool) holds True there."""
        self._recorder_for_new_node(scalar_cuda_pred_tensor).begin_conditional(
            scalar_cuda_pred_tensor, loops=False)

    def begin_capture_to_while_node(self, scalar_cuda_pred_tensor) -> None:
        """As `begin_capture_to_if_node`, a while node: the body runs again as long as the
        predicate set last (here, or by `set_conditional_handle_for_current_node`) holds True."""
        self._recorder_for_new_node(scalar_cuda_pred_tensor).begin_conditional(
            scalar_cuda_pred_tensor, loops=True)

    def set_conditional_handle_for_current_node(self, scalar_cuda_pred_tensor) -> None:
        recorder = self._recorder_with_open_node(
            "!conditional_node_handles_.empty()", "No active CUDA graph conditional node.")
        _check_predicate(scalar_cuda_pred_tensor, self._host)
        recorder.set_condition(scalar_cuda_pred_tensor)

    def end_capture_to_conditional_node(self) -> None:
        recorder = self._recorder_with_open_node(
            "!conditional_graph_capture_ids_.empty()", "Missing capture ID for conditional node.")
        if recorder.end_conditional():
            # CUDA records the error with the capture: capture_end() raises it again
            self._capture_error = RuntimeError(RNG_IN_BODY)
            raise RuntimeError(RNG_IN_BODY)

    def _recorder_for_new_node(self, pred):
        """CUDAGraph::begin_capture_to_conditional_node's checks, in its order."""
        if self._instantiated:
            raise RuntimeError("This CUDAGraph instance already owns a captured graph.")
        if self._session is None or not self._host.is_current_stream_capturing():
            raise RuntimeError("capture_begin() must be called before "
                               "begin_capture_to_conditional_node()")
        _check_predicate(pred, self._host)
        return self._session.recorder

    def _recorder_with_open_node(self, condition: str, message: str):
        recorder = None if self._session is None else self._session.recorder
        if recorder is None or not recorder.conditionals:
            raise RuntimeError(f"{condition} INTERNAL ASSERT FAILED at "
                               f"\"aten/src/ATen/cuda/CUDAGraph.cpp\", please report a bug to "
                               f"PyTorch. {message}")
        return recorder


def _check_predicate(pred, host) -> None:
    """torch's set-handle kernel reads `pred.const_data_ptr<bool>()` on the device."""
    if not isinstance(pred, torch.Tensor):
        raise TypeError(f"a conditional node's predicate must be a Tensor, got "
                        f"{type(pred).__name__}")
    if pred.dtype != torch.bool:
        raise RuntimeError(f"expected scalar type Bool but found {scalar_type_name(pred.dtype)}")
    if not host.memory.is_device(pred) or pred.numel() == 0:
        where = "an empty tensor" if pred.numel() == 0 else f"a {pred.device} tensor"
        raise CaptureError(
            f"a conditional node's predicate is {where}: CUDA's node reads its first element in "
            f"device memory at each replay (cudaGraphSetConditional), which would read past the "
            f"tensor or from host memory the kernel cannot address; pass a one-element bool "
            f"tensor on the device", op="begin_capture_to_conditional_node")


def _build_calls() -> frozenset[str]:
    names: set[str] = set()
    if torch_internals.optional_name("cudagraph_if_else_node") is not None:
        names |= {"begin_capture_to_if_node", "end_capture_to_conditional_node"}
    if torch_internals.optional_name("cudagraph_while_loop_node") is not None:
        names |= {"begin_capture_to_while_node", "set_conditional_handle_for_current_node"}
    return frozenset(names)


# The calls this build's CUDAGraph has, with the helpers they share.
BUILD_CALLS = _build_calls()
ConditionalNodeCalls = type("ConditionalNodeCalls", (), {
    name: value for name, value in vars(_AllConditionalNodeCalls).items()
    if name in BUILD_CALLS or (BUILD_CALLS and name.startswith("_recorder"))})

__all__ = ["BUILD_CALLS", "ConditionalNodeCalls", "RNG_IN_BODY"]
