"""Entering and leaving emulate_cuda(): bad use is refused with the value and what is accepted,
and leaving restores torch.cuda exactly."""

from __future__ import annotations

import pytest
import torch

import harness
from harness.graphs import get_backend

PATCHED = [(torch.cuda, "is_available"), (torch.cuda, "CUDAGraph"), (torch.cuda, "Stream"),
           (torch.cuda, "current_stream"), (torch.cuda, "memory_allocated"), (torch.cuda, "_sleep"),
           (torch.cuda.graphs, "graph_pool_handle"), (torch.version, "cuda"),
           (torch.Tensor, "record_stream"), (torch.accelerator, "current_stream")]


def test_leaving_restores_torch_cuda_exactly(outside_emulation):
    before = [(owner.__dict__.get(name, "<absent>")) for owner, name in PATCHED]
    absent = [hasattr(torch._C, n) for n in ("_host_emptyCache", "_cuda_setStream")]
    modes = torch._C._len_torch_function_stack()
    with harness.emulate_cuda(device="cpu"):
        assert torch.cuda.is_available()
    assert [(owner.__dict__.get(name, "<absent>")) for owner, name in PATCHED] == before
    assert [hasattr(torch._C, n) for n in ("_host_emptyCache", "_cuda_setStream")] == absent
    assert torch._C._len_torch_function_stack() == modes and not torch.cuda.is_available()


def test_bad_use_names_the_value_and_what_is_accepted(outside_emulation):
    with pytest.raises(ValueError, match="device='tpu'.*'auto', 'cpu', 'cuda'"):
        with harness.emulate_cuda(device="tpu"):
            pass
    with pytest.raises(TypeError, match="unknown option.*'colour'.*accepted"):
        with harness.emulate_cuda(colour="red"):
            pass
    with harness.emulate_cuda(device="cpu"):
        with pytest.raises(RuntimeError, match="inside another emulate_cuda"):
            with harness.emulate_cuda():
                pass
    with torch.device("meta"):
        with pytest.raises(RuntimeError, match="inside a device mode"):
            with harness.emulate_cuda():
                pass
    x = torch.ones(2)

    def capture_entering():
        with harness.emulate_cuda():
            pass
        return x + 1

    with pytest.raises(RuntimeError, match="inside a graph capture"):
        get_backend("emulated").capture(capture_entering)


def test_options_configure_the_device(outside_emulation):
    with harness.emulate_cuda(device="cpu", name="Tiny GPU", total_memory=2**30, device_count=2,
                              capability=(8, 0)):
        assert torch.cuda.get_device_name() == "Tiny GPU" and torch.cuda.device_count() == 2
        assert torch.cuda.get_device_capability(1) == (8, 0)
        assert torch.cuda.mem_get_info()[1] == 2**30


@pytest.mark.gpu
def test_on_a_gpu_the_sanitizer_keeps_real_tensors_and_names_freed_memory():
    from harness.graphs import FreedMemoryError
    from harness.emulation import emulation_active

    if emulation_active() is not None:
        pytest.skip("checks emulate_cuda() entered on a real GPU, outside any emulation")
    with harness.emulate_cuda():
        x = torch.ones(4, device="cuda")
        assert type(x).__name__ == "Tensor" and x.device.type == "cuda"
        w = torch.ones(4, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x * w
        del w
        with pytest.raises(FreedMemoryError):
            g.replay()


_CHILD = ("import os, sys, torch\n"
          "print(torch.cuda.is_available(), torch.cuda.get_device_properties(0).total_memory "
          "if torch.cuda.is_available() else 0, 'sitecustomize' in sys.modules)\n")


def test_children_enter_the_same_emulation_only_when_asked(outside_emulation):
    import os
    import subprocess
    import sys

    before = os.environ.get("PYTHONPATH")
    with harness.emulate_cuda(device="cpu", children=True, total_memory=3 * 2**30):
        inherited = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                                   check=True)
        untouched = subprocess.run([sys.executable, "-c", "import sys; print('torch' in sys.modules)"],
                                   capture_output=True, text=True, check=True)
    assert inherited.stdout.split() == ["True", str(3 * 2**30), "True"], inherited.stderr
    assert untouched.stdout.strip() == "False"  # a child that never imports torch pays nothing
    assert os.environ.get("PYTHONPATH") == before
    with harness.emulate_cuda(device="cpu"):
        alone = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                               check=True)
    assert alone.stdout.split()[0] == "False"


_EXPLICIT_CHILD = """
import torch, harness
with harness.emulate_cuda() as state:  # what a pytest --emulate-cuda xdist worker does
    print(state.kind)
"""


def test_a_child_entering_its_own_emulation_gets_the_emulated_device(outside_emulation):
    # The inherited emulation answers torch.cuda.is_available() with True: asked before leaving it,
    # emulate_cuda() took the child for a GPU machine and entered the sanitizer (xdist workers
    # under --emulate-cuda failed to start: "Torch not compiled with CUDA enabled").
    import subprocess
    import sys

    with harness.emulate_cuda(device="cpu", children=True):
        child = subprocess.run([sys.executable, "-c", _EXPLICIT_CHILD], capture_output=True, text=True)
    assert child.returncode == 0 and child.stdout.split() == ["cpu"], child.stderr[-2000:]


@pytest.mark.slow  # a pytest or torch.compile subprocess: nightly_cpu runs it
def test_a_cpu_default_device_does_not_block_entering_and_dynamo_resets_inside(outside_emulation):
    torch.set_default_device("cpu")  # what a runner may leave behind: the default anyway
    try:
        with harness.emulate_cuda(device="cpu"):
            torch._dynamo.reset()  # imports inductor's cudagraph trees once CUDA looks built
            compiled = torch.compile(lambda x: x * 2)
            assert compiled(torch.ones(2, device="cuda")).is_cuda
            torch._dynamo.reset()
    finally:
        torch.set_default_device(None)
