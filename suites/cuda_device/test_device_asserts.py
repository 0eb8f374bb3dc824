"""An index out of bounds in a replayed kernel fails as on CUDA: `torch.AcceleratorError` "CUDA error:
device-side assert triggered", where the cpu kernel raises `IndexError` (or `RuntimeError`) in its own
words; a class index outside `cross_entropy`'s classes too (the cpu's "Target 8 is out of bounds."),
and a bag's index in `embedding_bag` (the cpu's "Index 0 of input takes value 8 which is not in the
valid range [0, 8)"; an H100 asserted, torch 2.11). The windowed-Mistral case of the transformers
audit: a StaticCache's sliding layer of 8 positions written at position 8 by `index_copy_` in a
replay past the window. Natively (in a process of its own: the assert leaves the CUDA context
unusable) the same replay shows CUDA's verdict."""

from __future__ import annotations

from typing import Callable

import pytest
import torch

from harness.graphs import get_backend
from harness.graphs.emulated import EmulatedBackend
from suites.cuda_device._own_process import in_a_process_of_its_own

DEVICE_ASSERT = "CUDA error: device-side assert triggered"


def _window_write(position: torch.Tensor, cache: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    return cache.index_copy_(2, position, new)  # transformers' StaticCache layer update


# (name, op, the captured call given a device index tensor and a device source tensor)
CASES: list[tuple[str, str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]] = [
    ("index_copy_", "aten.index_copy_", lambda i, x: x.index_copy_(0, i, torch.ones_like(i, dtype=x.dtype))),
    ("index_select", "aten.index_select", lambda i, x: x.index_select(0, i)),
    ("gather", "aten.gather", lambda i, x: x.gather(0, i)),
    ("embedding", "aten.embedding", lambda i, x: torch.nn.functional.embedding(i, x.view(8, 1))),
    ("advanced indexing", "aten.index", lambda i, x: x[i]),
    # a class index past the 8 classes: LossNLL.cu asserts it on the device
    ("cross_entropy's target", "aten.nll_loss_forward",
     lambda i, x: torch.nn.functional.cross_entropy(x.view(1, 8), i)),
    # one bag; EmbeddingBag.cu asserts on the device where the cpu's check raises on the host
    ("embedding_bag", "aten._embedding_bag", lambda i, x: torch.nn.functional.embedding_bag(
        i, x.view(8, 1), torch.zeros(1, dtype=torch.long, device=i.device))),
]


def _replay_past_the_end(call, device: str) -> list[float]:
    """Capture `call` with an index in range, replay it, move the index past the end, replay and
    synchronize (CUDA reports a kernel's assertion there, not at the launch); the values of the
    good replay."""
    index = torch.tensor([1], device=device)
    source = torch.arange(8.0, device=device)
    call(index, source)  # warmup, as a runtime captures
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = call(index, source)
    g.replay()
    torch.cuda.synchronize()
    good = out.flatten().tolist()
    index.fill_(8)
    g.replay()
    torch.cuda.synchronize()
    return good


def _native_outcome(case_index: int) -> tuple[str, str]:
    try:
        _replay_past_the_end(CASES[case_index][2], "cuda")
    except Exception as error:  # noqa: BLE001 - its class is the outcome under test
        return type(error).__name__, (str(error).splitlines() or [""])[0]
    return "", ""


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_an_index_out_of_bounds_in_a_replay_is_cudas_device_side_assert(cuda_kind, case):
    name, op, call = case
    if cuda_kind == "native":
        kind, first_line = in_a_process_of_its_own(__file__, "_native_outcome", CASES.index(case))
        assert kind == "AcceleratorError" and first_line.startswith(DEVICE_ASSERT), (kind, first_line)
        return
    if cuda_kind == "sanitizer":
        pytest.skip("the sanitizer replays real kernels: CUDA's own assert, as natively")
    with pytest.raises(torch.AcceleratorError) as caught:
        _replay_past_the_end(call, "cuda")
    text = str(caught.value)
    assert text.startswith(DEVICE_ASSERT + "\n"), text
    assert op in text and "graph replay" in text, text
    cpu_words = text.splitlines()[1]  # the cpu kernel's own words follow, naming the index
    assert "out of" in cpu_words or "not in the valid range" in cpu_words, cpu_words


def test_a_negative_index_past_the_start_asserts_too(cuda_device):
    x = torch.arange(8.0, device="cuda")
    index = torch.tensor([1], device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x.index_select(0, index)
    index.fill_(-1)  # CUDA's index_select asserts on any index outside [0, size)
    with pytest.raises(torch.AcceleratorError, match=DEVICE_ASSERT):
        g.replay()
    index.fill_(2)
    g.replay()
    assert y.tolist() == [2.0]


def test_a_traced_window_write_past_the_window_names_the_op_and_line():
    """The audit's windowed Mistral, on the emulated backend with a trace (what the explainer
    captures): the error also names the line that issued the write."""
    backend = EmulatedBackend(trace=True)
    cache = torch.zeros(1, 1, 8, 2, device=backend.device)
    new = torch.ones(1, 1, 1, 2, device=backend.device)
    position = torch.tensor([6], device=backend.device)
    graph = backend.capture(lambda: _window_write(position, cache, new))
    graph.replay()
    assert cache[0, 0, 6].tolist() == [1.0, 1.0]
    position.fill_(8)
    with pytest.raises(torch.AcceleratorError, match=DEVICE_ASSERT) as caught:
        graph.replay()
    text = str(caught.value)
    assert "aten.index_copy_" in text and "index 8 is out of bounds for dimension 2 with size 8" in text
    assert "cache.index_copy_(2, position, new)" in text  # the line


def test_the_untraced_emulated_backend_names_the_op():
    backend = get_backend("emulated")
    cache = torch.zeros(8, device=backend.device)
    position = torch.tensor([3], device=backend.device)
    graph = backend.capture(lambda: cache.index_copy_(0, position, torch.ones(1, device=backend.device)))
    graph.replay()
    position.fill_(8)
    with pytest.raises(torch.AcceleratorError, match=DEVICE_ASSERT + "\naten.index_copy_"):
        graph.replay()


@pytest.mark.parametrize("name, op, call", CASES, ids=[c[0] for c in CASES])
def test_an_eager_index_out_of_bounds_on_the_device_is_cudas_device_assert(cuda_device, name, op, call):
    """Eager, CUDA reports the kernel's assertion at the next synchronization as
    `torch.AcceleratorError` (measured on an H100, torch 2.11, advanced indexing); the cpu kernel
    raised `IndexError` at the op, which code catching CUDA's error does not catch. A host tensor
    keeps the cpu kernel's error."""
    index = torch.tensor([9], device="cuda")
    source = torch.arange(8.0, device="cuda")
    with pytest.raises(torch.AcceleratorError, match=DEVICE_ASSERT):
        call(index, source)
        torch.cuda.synchronize()
    with pytest.raises((IndexError, RuntimeError)) as host_error:
        call(index.cpu(), source.cpu())
    assert not isinstance(host_error.value, torch.AcceleratorError)


@pytest.mark.parametrize("index", [10, -11, (0, 10)], ids=["int", "negative int", "tuple of ints"])
def test_a_python_integer_index_out_of_range_is_the_hosts_index_error(cuda_kind, index):
    """An integer index is checked on the host before any kernel (ATen's applySlicing), on CUDA
    too: `IndexError`, not the device-side assert of an index tensor. The emulated device raised
    CUDA's assert for it, which code catching IndexError does not catch."""
    x = torch.zeros(4, 4, device="cuda") if isinstance(index, tuple) else torch.zeros(4, device="cuda")
    with pytest.raises(IndexError, match="is out of bounds for dimension") as read:
        x[index]
    assert not isinstance(read.value, torch.AcceleratorError)
    with pytest.raises(IndexError, match="is out of bounds for dimension") as write:
        x[index] = 1.0
    assert not isinstance(write.value, torch.AcceleratorError)
    torch.cuda.synchronize()  # no device-side assert was left behind


def test_an_integer_beside_an_index_tensor_out_of_range_is_still_the_devices(cuda_device):
    x = torch.zeros(4, 4, device="cuda")
    with pytest.raises(torch.AcceleratorError, match=DEVICE_ASSERT):
        x[1, torch.tensor([9], device="cuda")]
        torch.cuda.synchronize()
