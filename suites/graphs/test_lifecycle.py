"""Reset, nesting, and the modes a capture runs under."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import CaptureError, get_backend


def test_replay_after_reset_raises(backend):
    x = torch.ones(2, device=backend.device)
    graph = backend.capture(lambda: x + 1)
    graph.replay()
    graph.reset()
    with pytest.raises(CaptureError, match="reset"):
        graph.replay()


def test_capture_inside_a_capture_raises(backend):
    x = torch.ones(2, device=backend.device)
    seen = []

    def outer():
        seen.append(backend.is_capturing())
        backend.capture(lambda: x + 1)

    with pytest.raises(CaptureError, match="inside a capture"):
        backend.capture(outer)
    assert seen == [True]
    assert not backend.is_capturing()


def test_device_stays_usable_after_a_failed_capture(backend):
    # On CUDA a capture broken by a host sync leaves the default generator marked as capturing;
    # the backend must undo that, or every later random op on the device raises.
    x = torch.ones(2, device=backend.device)
    with pytest.raises(CaptureError):
        backend.capture(lambda: (x + 1).sum().item())
    assert not backend.is_capturing()
    noise = torch.rand(4, device=backend.device)
    graph = backend.capture(lambda: x * 2 + torch.rand(2, device=backend.device))
    graph.replay()
    backend.synchronize()
    assert noise.isfinite().all() and (graph.output >= 2).all() and (graph.output < 3).all()


def test_is_capturing_is_false_outside_capture(backend):
    assert not backend.is_capturing()


def test_capture_under_no_grad_with_parameters(backend):
    layer = torch.nn.Linear(4, 3).to(backend.device)
    x = torch.randn(2, 4, device=backend.device)
    with torch.no_grad():
        graph = backend.capture(lambda: layer(x))
        expected = layer(x)
    graph.replay()
    backend.synchronize()
    assert torch.allclose(graph.output, expected)


def test_replay_keeps_the_inference_mode_of_capture(backend):
    layer = torch.nn.Linear(4, 3).to(backend.device)
    x = torch.randn(2, 4, device=backend.device)
    with torch.inference_mode():
        graph = backend.capture(lambda: torch.relu(layer(x)))
        expected = torch.relu(layer(x))
    graph.replay()  # outside inference mode: writes into inference tensors must still work
    backend.synchronize()
    assert graph.output.is_inference()
    assert torch.allclose(graph.output, expected)


def test_get_backend_rejects_unknown_names():
    with pytest.raises(ValueError, match="'tpu'"):
        get_backend("tpu")


def test_auto_backend_follows_cuda_availability():
    from harness.emulation import emulation_active

    # Inside emulate_cuda() (the emulated device, or the sanitizer on a GPU) torch.cuda's graphs
    # are the emulator's.
    real_cuda = torch.cuda.is_available() and emulation_active() is None
    expected = "cuda" if real_cuda else "emulated"
    assert get_backend("auto").name == expected


def test_capture_with_autograd_enabled(backend):
    layer = torch.nn.Linear(4, 3).to(backend.device)
    x = torch.randn(2, 4, device=backend.device)
    graph = backend.capture(lambda: torch.relu(layer(x)))
    graph.replay()
    backend.synchronize()
    with torch.no_grad():
        assert torch.allclose(graph.output, torch.relu(layer(x)))


def test_cuda_error_mapping_finds_the_capture_error_behind_an_unrelated_one():
    # Pure exception handling, so it runs without CUDA: the sync happened while the captured code
    # was handling a KeyError; the capture's end then raised its own error on top.
    from harness.graphs.cuda import _as_capture_error

    try:
        try:
            raise KeyError("handled by the captured code")
        except KeyError:
            try:
                raise RuntimeError("aten::nonzero: operation not permitted when stream is capturing")
            except RuntimeError:
                raise RuntimeError("operation failed due to a previous error during capture")
    except RuntimeError as error:
        mapped = _as_capture_error(error)
    assert isinstance(mapped, CaptureError)
    assert mapped.op == "aten::nonzero" and "operation not permitted" in str(mapped)
