"""What the emulated device refuses during a capture begins with CUDA's own message, word for word
(code written for CUDA matches it: PyTorch's own graph tests use assertRaisesRegex), is raised as
the exception type CUDA raises, and then names the op, the user's line and the remedy.

The texts are PyTorch's: aten/src/ATen/native/cuda/Copy.cu (pageable copies),
c10/cuda/CUDAException.cpp with the CUDA runtime's error strings (host syncs, invalidated and
unjoined captures), aten/src/ATen/cuda/CUDAGeneratorImpl.cpp (reseeding)."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import CaptureError, CaptureInvalidatedError, CaptureSyncError

PAGEABLE = ("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU "
            "tensor is pinned. Please use tensor.pin_memory() or allocate the tensor with "
            "pin_memory=True.")
NOT_PERMITTED = "CUDA error: operation not permitted when stream is capturing"
RESEED = ("CUDAGeneratorImpl::set_current_seed can be called during stream capture only if new "
          "seed is the same as the original seed.")
UNJOINED = "CUDA error: capturing stream has unjoined work"
INVALIDATED = "CUDA error: operation failed due to a previous error during capture"
HERE = "test_cuda_error_texts.py"


def _refusal(work) -> CaptureError:
    """The refused call's error: where it invalidated the capture, torch.cuda.graph's exit fails
    at capture_end as CUDA's does, and the refused call's error is that one's context."""
    with pytest.raises(CaptureError) as caught:
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            work()
    if isinstance(caught.value, CaptureInvalidatedError):
        return caught.value.__context__
    return caught.value


@pytest.mark.parametrize("copy", ["copy_", "to", "cuda", "tensor"])
def test_a_pageable_host_to_device_copy_gets_copy_cu_s_message(cuda_device, copy):
    buffer = torch.zeros(3, device="cuda")
    host = torch.ones(3)
    work = {"copy_": lambda: buffer.copy_(host), "to": lambda: host.to("cuda"),
            "cuda": lambda: host.cuda(), "tensor": lambda: torch.tensor([1.0], device="cuda")}[copy]
    error = _refusal(work)
    message = str(error)
    assert message.startswith(PAGEABLE + "\n"), message
    assert not isinstance(error, torch.AcceleratorError)  # a TORCH_CHECK: a plain RuntimeError
    assert HERE in message  # the user's line
    assert "before capture" in message  # the remedy


@pytest.mark.parametrize("read", ["cpu", "copy_", "tolist"])
def test_a_device_to_pageable_host_copy_gets_copy_cu_s_message(cuda_device, read):
    x = torch.ones(3, device="cuda")
    host = torch.zeros(3)
    work = {"cpu": lambda: x.cpu(), "copy_": lambda: host.copy_(x), "tolist": lambda: x.tolist()}[read]
    message = str(_refusal(work))
    assert message.startswith(PAGEABLE + "\n"), message
    assert HERE in message


@pytest.mark.parametrize("read", ["item", "bool", "nonzero"])
def test_a_host_sync_is_cuda_s_accelerator_error(cuda_device, read):
    x = torch.ones(3, device="cuda")
    work = {"item": lambda: x.sum().item(), "bool": lambda: bool(x.sum() > 0),
            "nonzero": lambda: torch.nonzero(x)}[read]
    error = _refusal(work)
    assert isinstance(error, torch.AcceleratorError) and isinstance(error, CaptureSyncError)
    message = str(error)
    assert message.startswith(NOT_PERMITTED + "\n"), message
    assert "aten." in message and HERE in message  # the op and the line


@pytest.mark.parametrize("sync", ["item", "synchronize", "stream"])
def test_a_sync_in_a_graph_block_ends_it_with_capture_end_s_error(cuda_kind, sync):
    # H100, torch 2.11: the refused sync invalidates the capture, so torch.cuda.graph's exit
    # fails in cudaStreamEndCapture; the caller sees that error, the sync's as its context.
    x = torch.ones(3, device="cuda")
    work = {"item": lambda: x.sum().item(), "synchronize": torch.cuda.synchronize,
            "stream": lambda: torch.cuda.current_stream().synchronize()}[sync]
    with pytest.raises(torch.AcceleratorError) as caught:
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            work()
    assert str(caught.value).startswith(INVALIDATED), caught.value
    assert str(caught.value.__context__).startswith(NOT_PERMITTED), caught.value.__context__
    if cuda_kind != "native":
        assert isinstance(caught.value, CaptureInvalidatedError)
        assert NOT_PERMITTED in str(caught.value)  # the cause is named in the message too


def test_a_graph_block_failing_without_a_refused_call_shows_that_error(cuda_kind):
    # A torch check (a pageable copy) or the user's own exception does not invalidate the
    # capture: cudaStreamEndCapture succeeds and the body's exception is the one seen.
    with pytest.raises(ValueError, match="the user's own"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            torch.ones(3, device="cuda").add_(1)
            raise ValueError("the user's own")
    with pytest.raises(RuntimeError, match="unless the CPU tensor is pinned") as caught:
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            torch.zeros(3, device="cuda").copy_(torch.ones(3))
    assert caught.value.__context__ is None


def test_a_blocking_copy_from_pinned_memory_is_a_sync(cuda_device):
    # Copy.cu captures the cudaMemcpyAsync, then memcpy_and_sync waits for the stream.
    pinned = torch.ones(3).pin_memory()
    buffer = torch.zeros(3, device="cuda")
    error = _refusal(lambda: buffer.copy_(pinned))
    assert isinstance(error, torch.AcceleratorError)
    assert str(error).startswith(NOT_PERMITTED + "\n") and "non_blocking=True" in str(error)
    error = _refusal(lambda: pinned.to("cuda"))
    assert str(error).startswith(NOT_PERMITTED + "\n")


def test_a_blocking_copy_into_pinned_memory_is_a_sync(cuda_device):
    x = torch.ones(3, device="cuda")
    pinned = torch.zeros(3).pin_memory()
    error = _refusal(lambda: pinned.copy_(x))
    assert isinstance(error, torch.AcceleratorError) and str(error).startswith(NOT_PERMITTED)


def test_a_non_blocking_copy_into_pinned_memory_is_captured(cuda_device):
    # CUDA records the cudaMemcpyAsync: each replay writes the pinned buffer again.
    x = torch.zeros(3, device="cuda")
    pinned = torch.zeros(3).pin_memory()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        pinned.copy_(x * 2, non_blocking=True)
    for value in (1.0, 4.0):
        x.fill_(value)
        g.replay()
        torch.cuda.synchronize()
        assert pinned.tolist() == [2 * value] * 3


def test_reseeding_during_capture_gets_cuda_generator_s_message(cuda_device):
    torch.cuda.manual_seed(0)
    error = _refusal(lambda: torch.cuda.manual_seed(1))
    message = str(error)
    assert message.startswith(RESEED + "\n"), message
    assert "seed 1" in message and HERE in message


def test_a_fork_not_joined_back_gets_the_runtime_s_message(cuda_kind):
    if cuda_kind == "native":
        pytest.skip("a refused real capture leaves the process's CUDA state broken: "
                    "suites/public_bugs/test_dispatch_event_never_waited_in_capture.py gets "
                    "CUDA's own refusal in a process of its own")
    x = torch.ones(3, device="cuda")
    side = torch.cuda.Stream()
    caller = torch.cuda.current_stream()
    try:
        with pytest.raises(CaptureError) as caught:
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    x.mul_(3)
    finally:
        # torch.cuda.graph's exit leaves its capture stream current when capture_end raises.
        torch.cuda.set_stream(caller)
    assert str(caught.value).startswith(UNJOINED + "\n"), str(caught.value)


def _captured(keep_graph: bool) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    graph = torch.cuda.CUDAGraph(keep_graph=keep_graph)
    x = torch.zeros(8, device="cuda")
    with torch.cuda.graph(graph, capture_error_mode="relaxed"):
        x += 1.0
    return graph, x


def test_the_raw_graph_and_instantiate_follow_cuda_graph_cpp(cuda_device):
    graph, _ = _captured(keep_graph=False)
    with pytest.raises(RuntimeError, match=r"^instantiate\(\) is intended to be called by the "
                                           r"user only when keep_graph=true$"):
        graph.instantiate()
    # torch 2.14 split capture_end and reworded the refusal (the template is gone once finalized)
    with pytest.raises(RuntimeError, match="^(You cannot access the raw cudaGraph_t instance "
                                           "unless CUDAGraph was initialized with keep_graph=true"
                                           "|No cudaGraph_t is available: either capture_end\\(\\) "
                                           "has not been called)"):
        graph.raw_cuda_graph()
    kept, _ = _captured(keep_graph=True)
    with pytest.raises(RuntimeError, match=r"^You cannot access the raw cudaGraphExec_t instance "
                                           r"until instantiate\(\) has been called"):
        kept.raw_cuda_graph_exec()
    with pytest.raises(RuntimeError, match=r"^capture_end\(\) must have been called before "
                                           r"calling instantiate"):
        torch.cuda.CUDAGraph(keep_graph=True).instantiate()
    with pytest.raises(RuntimeError, match=r"^capture_end\(\) called before capture_begin\(\)"):
        torch.cuda.CUDAGraph().capture_end()


# torch 2.14 split capture_end and dumps the graph's template through raw_cuda_graph() (and
# cuda-bindings); before, CUDAGraph::debug_dump warned where debug mode was off.
# Read from the build, not from torch.cuda.graphs.CUDAGraph: under a session-wide --emulate-cuda
# that name is the emulated class already at collection, which has every build's hooks.
DUMPS_THE_TEMPLATE = torch.torch_version.TorchVersion(torch.__version__) >= (2, 14)


@pytest.mark.skipif(DUMPS_THE_TEMPLATE, reason="torch 2.14+ dumps the template (next test)")
def test_debug_dump_without_debug_mode_only_warns(cuda_device, tmp_path):
    graph, _ = _captured(keep_graph=False)
    path = tmp_path / "graph.dot"
    with pytest.warns(UserWarning, match=r"CUDA Graphs debug not enabled, set with "
                                         r"\[graph\].enable_debug_mode\(\)"):
        graph.debug_dump(str(path))
    assert not path.exists()
    graph.enable_debug_mode()
    graph.debug_dump(str(path))
    assert path.read_text().startswith("digraph")


@pytest.mark.skipif(not DUMPS_THE_TEMPLATE, reason="torch before 2.14 warns (test above)")
def test_debug_dump_of_a_graph_without_its_template_raises_as_raw_cuda_graph(cuda_device,
                                                                              tmp_path):
    graph, _ = _captured(keep_graph=False)
    path = tmp_path / "graph.dot"
    with pytest.raises(RuntimeError, match=r"^No cudaGraph_t is available: either capture_end\(\) "
                                           r"has not been called"):
        graph.debug_dump(str(path))
    graph.enable_debug_mode()  # keep_graph from now on: the template is gone already
    with pytest.raises(RuntimeError, match=r"^No cudaGraph_t is available"):
        graph.debug_dump(str(path))
    assert not path.exists()
    kept, _ = _captured(keep_graph=True)
    kept.debug_dump(str(path))
    assert path.read_text().startswith("digraph")


@pytest.mark.skipif(not hasattr(torch.cuda.graphs, "export_dot"),
                    reason="torch before 2.14 has no export_dot")
def test_export_dot_dumps_the_template_a_capture_end_hook_sees(cuda_kind, tmp_path):
    # PyTorch's test_graph_debugdump: export_dot's hook dumps a keep_graph=False graph while its
    # template is live; debug_dump() after the capture finds none
    pytest.importorskip("cuda.bindings.runtime", reason="torch's DOT dump needs cuda-bindings")
    graph = torch.cuda.CUDAGraph()
    path = tmp_path / "hook.dot"
    graph.register_capture_end_hook(torch.cuda.graphs.export_dot(str(path)))
    x = torch.zeros(8, device="cuda")
    with torch.cuda.graph(graph):
        x.add_(1.0)
    assert path.read_text().startswith("digraph")
    with pytest.raises(RuntimeError, match=r"^No cudaGraph_t is available"):
        graph.debug_dump(str(tmp_path / "after.dot"))


@pytest.mark.skipif(not DUMPS_THE_TEMPLATE, reason="torch before 2.14 dumps without cuda-bindings")
def test_the_dot_dump_needs_cuda_bindings_as_torchs_does(cuda_device, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda.graphs, "_cuda_runtime", None)  # a machine without them
    kept, _ = _captured(keep_graph=True)
    with pytest.raises(RuntimeError, match="requires the cuda-bindings package"):
        kept.debug_dump(str(tmp_path / "graph.dot"))
