"""A pytest session under `--emulate-cuda`: where a race found at a tensor's free is reported."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from harness.emulation import emulation_active

_RACY_THEN_CLEAN = '''
import torch


def test_frees_a_side_stream_input_without_record_stream():
    side = torch.cuda.Stream()
    x = torch.ones(1024, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(1000)
        y = x * 2
    del x  # freed on the main stream while the side stream may still read it


def test_next_one_is_clean():
    assert torch.ones(4, device="cuda").sum().item() == 4
'''


@pytest.mark.slow  # a pytest or torch.compile subprocess: nightly_cpu runs it
def test_a_race_found_at_a_free_fails_the_test_that_freed_not_the_next(tmp_path):
    if emulation_active() is not None or torch.cuda.is_available():
        pytest.skip("runs a session under --emulate-cuda from one outside it, without a GPU")
    (tmp_path / "test_racy.py").write_text(_RACY_THEN_CLEAN)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p",
                           "no:cacheprovider", "--repro-dir", "none", "--emulate-cuda", "-rA",
                           "test_racy.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    out = done.stdout
    assert "FAILED test_racy.py::test_frees_a_side_stream_input_without_record_stream" in out, out
    assert "memory freed while another stream's work may still use it" in out, out
    assert "PASSED test_racy.py::test_next_one_is_clean" in out, out
