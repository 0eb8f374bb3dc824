"""The pytest processes the harness starts load its plugin where pytest would not by itself (a
harness on PYTHONPATH with no entry point, or PYTEST_DISABLE_PLUGIN_AUTOLOAD set): without it
`harness repro --emulate-cuda` failed with "unrecognized arguments: --emulate-cuda"."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import textwrap

import pytest

from harness.testdb.child_pytest import PLUGIN, plugin_arguments

INSTALLED = any(e.value == PLUGIN for e in importlib.metadata.entry_points(group="pytest11"))


def test_an_installed_harness_with_autoload_adds_nothing():
    if not INSTALLED:
        pytest.skip("the harness is not installed with its pytest11 entry point here")
    assert plugin_arguments({}) == []


def test_autoload_disabled_names_the_plugin():
    assert plugin_arguments({"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}) == ["-p", PLUGIN]


def test_a_child_started_with_autoload_disabled_knows_the_harnesss_options(tmp_path):
    (tmp_path / "test_x.py").write_text(textwrap.dedent("""
        def test_x(request):
            assert request.config.getoption("emulate_cuda") is False
    """))
    env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PATH": ""}
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_x.py"]
    without = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True)
    with_plugin = subprocess.run(args[:3] + plugin_arguments(env) + args[3:], cwd=tmp_path,
                                 env=env, capture_output=True, text=True)
    assert without.returncode != 0
    assert with_plugin.returncode == 0, with_plugin.stdout[-2000:]
