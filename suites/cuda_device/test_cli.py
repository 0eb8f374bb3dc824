"""`harness lint --emulate-cuda` and `harness repro --emulate-cuda`."""

from __future__ import annotations

import textwrap

import pytest
import torch

from harness import cli
from harness.emulation import emulation_active


def test_lint_under_emulate_cuda_names_a_pageable_copy_to_the_device(tmp_path, monkeypatch, capsys):
    if emulation_active() is not None or torch.cuda.is_available():
        pytest.skip("enters emulate_cuda() itself, without a GPU")
    (tmp_path / "cuda_step.py").write_text(textwrap.dedent("""
        import torch
        def make_step():
            table = torch.arange(4.0)          # a host table the step forgets to move
            x = torch.ones(4, device="cuda")
            return lambda: x * table.to(x.device)
        def make_clean_step():
            x = torch.ones(4, device="cuda")
            return lambda: x * 2
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["lint", "--emulate-cuda", "--factory", "cuda_step:make_step"]) == 1
    out = capsys.readouterr().out
    assert "host copy" in out and "pageable" in out
    assert cli.main(["lint", "--emulate-cuda", "--factory", "cuda_step:make_clean_step"]) == 0
    assert not torch.cuda.is_available()  # left the emulation


def test_repro_takes_emulate_cuda(tmp_path, capsys):
    # A recorded test that passes only on a CUDA device: replayed with --emulate-cuda on a machine
    # without a GPU, it passes only if the option reached the pytest run that re-runs it.
    if emulation_active() is not None or torch.cuda.is_available():
        pytest.skip("replays on the emulated CUDA device, without a GPU")
    from harness.repro import ReproRecord, write_record

    (tmp_path / "test_needs_cuda.py").write_text(textwrap.dedent("""
        import torch
        def test_sees_a_cuda_device():
            assert torch.cuda.is_available()
            assert float((torch.ones(2, device="cuda") * 2).sum()) == 4.0
    """))
    record = ReproRecord(node_id="test_needs_cuda.py::test_sees_a_cuda_device", backend="emulated",
                         torch=torch.__version__, root=str(tmp_path))
    path = write_record(record, tmp_path / "repro")
    assert cli.main(["repro", "--emulate-cuda", str(path)]) == 0
    captured = capsys.readouterr()
    assert "--emulate-cuda" in captured.out and "1 passed" in captured.out, captured.out
    assert "[repro] passes" in captured.err
