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
    missing = tmp_path / "missing.json"
    assert cli.main(["repro", "--emulate-cuda", str(missing)]) == 2
