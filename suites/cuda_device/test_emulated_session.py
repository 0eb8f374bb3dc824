"""A pytest session under `--emulate-cuda`: where a race of a tensor's free is reported (at the reuse
of its memory, or at the end of the test that freed it)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from harness.emulation import emulation_active

def _emulated_session(tmp_path, files: dict[str, str]) -> subprocess.CompletedProcess:
    """A pytest session under `--emulate-cuda` over `files` (name -> text) written to `tmp_path`,
    running the first; the others (a stand-in module) are importable beside it."""
    if emulation_active() is not None or torch.cuda.is_available():
        pytest.skip("runs a session under --emulate-cuda from one outside it, without a GPU")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path),
                                                       os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p",
                           "no:cacheprovider", "--repro-dir", "none", "--emulate-cuda", "-rA",
                           next(iter(files))], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)


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
    torch.zeros(1024, device="cuda")  # the main stream's next allocation may take x's block


def test_frees_a_side_stream_input_and_ends():
    side = torch.cuda.Stream()
    x = torch.ones(1024, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(1000)
        y = x * 2
    del x  # the next test's first allocation on the main stream may take x's block


def test_frees_a_side_stream_input_then_waits():
    side = torch.cuda.Stream()
    x = torch.ones(1024, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(1000)
        y = x * 2
    del x
    torch.cuda.current_stream().wait_stream(side)  # before anything reuses x's block: correct


def test_next_one_is_clean():
    assert torch.ones(4, device="cuda").sum().item() == 4
'''


@pytest.mark.slow  # a pytest or torch.compile subprocess: nightly_cpu runs it
def test_a_race_found_at_a_free_fails_the_test_that_freed_not_the_next(tmp_path):
    out = _emulated_session(tmp_path, {"test_racy.py": _RACY_THEN_CLEAN}).stdout
    assert "FAILED test_racy.py::test_frees_a_side_stream_input_without_record_stream" in out, out
    assert "memory freed while another stream's work may still use it" in out, out
    # A free the test's own work never reuses is the next test's hazard, judged at its end.
    assert "ERROR test_racy.py::test_frees_a_side_stream_input_and_ends" in out, out
    assert "the next test's allocations (this test ended)" in out, out
    assert "PASSED test_racy.py::test_frees_a_side_stream_input_then_waits" in out, out
    assert "PASSED test_racy.py::test_next_one_is_clean" in out, out


_LEAKS_THEN_CLEAN = '''
import pytest
import torch


@pytest.fixture
def side_input():
    side = torch.cuda.Stream()
    x = torch.ones(1024, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(1000)
        y = x * 2
    yield y
    del x  # freed in the fixture's teardown, on the main stream, while the side stream may read it


def test_a_fixture_frees_a_side_stream_input_in_its_teardown(side_input):
    assert side_input.shape == (1024,)


def test_after_the_racy_teardown_is_clean():
    assert torch.ones(4, device="cuda").sum().item() == 4


def test_leaves_a_side_stream_current():
    torch.cuda.set_stream(torch.cuda.Stream())


def test_after_the_left_stream_runs_on_the_default_stream():
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    x = torch.ones(1024, device="cuda")
    del x
'''


@pytest.mark.slow  # a pytest subprocess under --emulate-cuda: nightly_cpu runs it
def test_a_teardown_race_and_a_left_stream_are_the_leaving_tests_not_the_next(tmp_path):
    out = _emulated_session(tmp_path, {"test_leaks.py": _LEAKS_THEN_CLEAN}).stdout
    assert ("ERROR test_leaks.py::test_a_fixture_frees_a_side_stream_input_in_its_teardown"
            in out), out
    assert "memory freed while another stream's work may still use it" in out, out
    assert "PASSED test_leaks.py::test_after_the_racy_teardown_is_clean" in out, out
    assert "ERROR test_leaks.py::test_leaves_a_side_stream_current" in out, out
    assert "LeftStreamError: test_leaks.py::test_leaves_a_side_stream_current left" in out, out
    assert "PASSED test_leaks.py::test_after_the_left_stream_runs_on_the_default_stream" in out, out


_TORCH_TESTCASE_WITHOUT_SUPER_SETUP = '''
import torch
from torch.testing._internal.common_utils import TestCase


class OwnSetUp(TestCase):
    def setUp(self):  # as test_cuda_sanitizer.py's TestEventHandler: no super().setUp()
        self.value = 1

    def test_first(self):
        self.assertEqual(self.value, 1)

    def test_second_on_the_device(self):
        self.assertEqual(torch.ones(2, device="cuda").sum().item(), 2)
'''

# torch.testing's common_utils imports expecttest for its TestCase base; a stand-in suffices here
_EXPECTTEST_STAND_IN = '''
import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    pass
'''


@pytest.mark.slow  # a pytest subprocess: nightly_cpu runs it
def test_a_torch_testcase_without_super_setup_sees_no_leaked_mode(tmp_path):
    """PyTorch's TestCase compares the function-mode stack at tearDown with its length at setUp; a
    subclass that skips super().setUp() compares with the class default, 0. The emulation's own
    modes are on the stack for the whole session, so its first test failed with "torch function
    mode stack was leaked" and its tearDown popped the emulation's placement mode, leaving the
    next test's `device="cuda"` unplaced (until 2026-12-06)."""
    done = _emulated_session(tmp_path, {"test_own_setup.py": _TORCH_TESTCASE_WITHOUT_SUPER_SETUP,
                                        "expecttest.py": _EXPECTTEST_STAND_IN})
    out = done.stdout
    assert "PASSED test_own_setup.py::OwnSetUp::test_first" in out, out + done.stderr
    assert "PASSED test_own_setup.py::OwnSetUp::test_second_on_the_device" in out, out
