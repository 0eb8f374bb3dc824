"""Every torch build a user has: the CPU wheel and the CUDA wheel on a machine without a GPU (what
`pip install torch` gives a Linux CI runner). Entering the emulation never changes what torch
reports about its own build, and the device-generic APIs (`torch.load(map_location="cuda")`,
`torch.Stream`, `torch.Event`, `torch.accelerator`) work on the emulated device as on CUDA."""

from __future__ import annotations

import io
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import harness


def _build_report() -> dict:
    return {"version": torch.__version__, "cuda": torch.version.cuda, "hip": torch.version.hip,
            "git": torch.version.git_version, "cuda built": torch.backends.cuda.is_built(),
            "mps built": torch.backends.mps.is_built()}


def test_the_build_torch_reports_is_the_same_inside(outside_emulation):
    before = _build_report()
    with harness.emulate_cuda(device="cpu"):
        inside = _build_report()
    assert inside == before and _build_report() == before


def test_torch_load_mapped_to_cuda_gives_device_tensors(cuda_device):
    saved = io.BytesIO()
    torch.save({"w": torch.arange(6.0).view(2, 3), "step": 3}, saved)
    for where in ("cuda", "cuda:0", torch.device("cuda"), {"cpu": "cuda:0"}):
        loaded = torch.load(io.BytesIO(saved.getvalue()), map_location=where)
        w = loaded["w"]
        assert w.is_cuda and w.device == torch.device("cuda", 0) and loaded["step"] == 3
        assert torch.equal(w.cpu(), torch.arange(6.0).view(2, 3))
        assert cuda_device.memory.is_device(w)
    # torch.serialization checks the index against device_count() before any CUDA call
    with pytest.raises(RuntimeError, match="Attempting to deserialize object on CUDA device 3"):
        torch.load(io.BytesIO(saved.getvalue()), map_location="cuda:3")
    host = torch.load(io.BytesIO(saved.getvalue()), map_location="cpu")["w"]
    assert not host.is_cuda


def test_a_checkpoint_saved_from_the_device_loads_back_onto_it(cuda_device):
    saved = io.BytesIO()
    torch.save(torch.ones(4, device="cuda") * 2, saved)
    back = torch.load(io.BytesIO(saved.getvalue()))
    assert back.is_cuda and back.tolist() == [2.0] * 4
    assert not torch.load(io.BytesIO(saved.getvalue()), map_location="cpu").is_cuda


def test_torch_stream_and_event_for_cuda_are_the_devices(cuda_device):
    for stream in (torch.Stream("cuda"), torch.Stream(device="cuda"), torch.Stream()):
        # torch's generic type, as CUDA makes it, not a torch.cuda.Stream
        assert isinstance(stream, torch.Stream) and not isinstance(stream, torch.cuda.Stream)
        assert stream.device == torch.device("cuda", 0)
    side = torch.Stream("cuda")
    with torch.cuda.stream(side):
        x = torch.ones(3, device="cuda") + 1
    event = torch.Event("cuda", enable_timing=True)
    assert isinstance(event, torch.Event) and isinstance(event, torch.cuda.Event)
    event.record(side)
    torch.cuda.current_stream().wait_event(event)
    assert x.tolist() == [2.0] * 3 and event.query()
    assert isinstance(torch.Event(device="cuda"), torch.Event)
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.Event("cuda:3")
    assert not isinstance(torch.Stream("cpu"), torch.cuda.Stream)  # torch's own, for the cpu


def test_torch_accelerator_answers_for_the_device(cuda_device):
    assert torch.accelerator.is_available() and torch.accelerator.device_count() == 1
    assert torch.accelerator.current_accelerator() == torch.device("cuda")
    assert torch.accelerator.current_accelerator(check_available=True) == torch.device("cuda")
    assert torch.accelerator.current_device_index() == 0
    # a torch.Stream naming the current stream, as on CUDA (test_api_answers.py has the rest)
    assert torch.accelerator.current_stream().stream_id == torch.cuda.current_stream().stream_id
    torch.accelerator.synchronize()
    if hasattr(torch.accelerator, "device_index"):
        with torch.accelerator.device_index(0):
            assert torch.accelerator.current_device_index() == 0
    if hasattr(torch.accelerator, "memory_allocated"):
        before = torch.accelerator.memory_allocated()
        keep = torch.empty(1 << 20, device="cuda")
        assert torch.accelerator.memory_allocated() >= before + keep.nbytes


def test_torchvision_imports_inside_the_emulation(outside_emulation):
    pytest.importorskip("torchvision")  # imported here only to skip; the check runs fresh below
    code = textwrap.dedent("""
        import harness, torch
        with harness.emulate_cuda(device="cpu"):
            import torchvision
            print("ok", torchvision.__version__, torch.version.cuda)
    """)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr[-3000:]
    assert done.stdout.split()[-1] == str(torch.version.cuda)


ROOT = pathlib.Path(__file__).resolve().parents[2]


def _declared_torch_range() -> str:
    # the dependency line itself (tomllib is not in python 3.10, which the project supports)
    found = re.search(r'^\s*"(torch[<>=!~][^"]*)",?$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert found, "pyproject.toml declares no torch dependency"
    return found.group(1)


def test_the_declared_and_the_tested_torch_ranges_agree():
    declared = _declared_torch_range()
    tested = re.search(r'^torch_spec="([^"]+)"', (ROOT / "scripts/env.sh").read_text(), re.M)
    assert tested, "scripts/env.sh names no torch_spec"
    assert declared.replace(" ", "") == tested.group(1).replace(" ", "")
    assert re.fullmatch(r"torch>=2\.11,<2\.\d+", declared), declared  # bounded above


def test_this_torch_is_in_the_declared_range():
    low, high = re.fullmatch(r"torch>=([\d.]+),<([\d.]+)", _declared_torch_range()).groups()
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    as_tuple = lambda v: tuple(int(p) for p in v.split("."))[:2]  # noqa: E731
    assert as_tuple(low) <= version < as_tuple(high), (torch.__version__, low, high)


def test_a_cuda_version_is_reported_only_when_asked_and_only_meanwhile(outside_emulation, monkeypatch):
    # A CPU build (version None) or a CUDA build of that very version may report it.
    monkeypatch.setattr(torch.version, "cuda", None)
    with harness.emulate_cuda(device="cpu", cuda_version="12.8"):
        assert torch.version.cuda == "12.8"
    assert torch.version.cuda is None
    with harness.emulate_cuda(device="cpu"):
        assert torch.version.cuda is None


def test_a_cuda_version_other_than_the_builds_is_refused(outside_emulation, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    with pytest.raises(ValueError, match=r"CUDA 13.0 build .* cuda_version is for a CPU build"):
        with harness.emulate_cuda(device="cpu", cuda_version="12.8"):
            pass
    assert torch.version.cuda == "13.0"
    with pytest.raises(ValueError, match=r"expected a CUDA version such as '12.8'"):
        with harness.emulate_cuda(device="cpu", cuda_version="twelve"):
            pass


def test_the_cuda_version_setting_travels_from_lists_and_options():
    from harness.device_options import DeviceOptionError, device_from_mapping

    device = device_from_mapping({"cuda_version": "12.8"}, where="list x")
    assert device.emulate_cuda_kwargs()["cuda_version"] == "12.8"
    assert "--emulate-cuda-version=12.8" in device.pytest_args()
    with pytest.raises(DeviceOptionError, match="not a CUDA version"):
        device_from_mapping({"cuda_version": "12"}, where="list x")
