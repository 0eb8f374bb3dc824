"""A test-db block that says its lines run under the emulated CUDA device (`emulate_cuda: true` or
`{total_memory: 8GiB, ...}`): loaded, grouped, passed to pytest by `harness run`, and overridden by
`harness run`'s own device options. A user's list of CUDA tests then runs on a machine without one."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.device_options import DeviceOverride, EmulatedDevice
from harness.testdb import TestDbError
from harness.testdb.loader import load_file
from harness.testdb.runner import plan, pytest_command

LIST = """
version: 0.0.1
mine:
- emulate_cuda: {total_memory: 8GiB, schedule: adversarial}
  tests:
  - tests/cuda
- emulate_cuda: true
  tests:
  - tests/cuda_default
- tests:
  - tests/cpu
"""


def load(tmp_path: Path, text: str):
    path = tmp_path / "lists.yml"
    path.write_text(text)
    (test_list,) = load_file(path)
    return test_list


def test_a_block_field_puts_its_lines_under_the_emulated_device(tmp_path):
    sized, default, cpu = load(tmp_path, LIST).blocks
    assert sized.tests[0].emulation == EmulatedDevice(total_memory=8 << 30, schedule="adversarial")
    assert default.tests[0].emulation == EmulatedDevice()
    assert cpu.tests[0].emulation is None
    assert str(sized.tests[0]) == "tests/cuda # under emulate_cuda(total_memory=8GiB, schedule=adversarial)"


@pytest.mark.parametrize("field, message", [
    ("{total_memory: lots}", "block 1: emulate_cuda.total_memory 'lots': not a size"),
    ("{memory: 8GiB}", "block 1: emulate_cuda: unknown key(s) memory; accepted: total_memory, name"),
    ("{schedule: late}", "block 1: emulate_cuda.schedule 'late': accepted: issue_order, adversarial"),
    ("yes please", "block 1: emulate_cuda: must be true, false or a mapping"),
], ids=["size", "key", "schedule", "kind"])
def test_a_bad_field_names_the_list_the_block_and_the_value(tmp_path, field, message):
    with pytest.raises(TestDbError, match=r"list 'mine', " + message.replace("(", r"\(").replace(")", r"\)")):
        load(tmp_path, f"version: 1\nmine:\n- emulate_cuda: {field}\n  tests: [tests]\n")


def test_each_device_gets_its_own_pytest_process_with_its_options(tmp_path):
    test_list = load(tmp_path, LIST)
    lines = [line for block in test_list.blocks for line in block.tests]
    commands = [pytest_command(inv, backend="emulated", junit=tmp_path / "1.xml", workers=0)
                for inv in plan(lines)]
    assert len(commands) == 3
    sized, default, cpu = commands
    assert sized[-3:] == ["--emulate-cuda", "--emulate-cuda-memory=8GiB", "--cuda-schedule=adversarial"]
    assert default[-1] == "--emulate-cuda" and "--emulate-cuda" not in cpu


def test_harness_run_options_win_over_the_lists_device():
    listed = EmulatedDevice(total_memory=8 << 30, schedule="adversarial")
    override = DeviceOverride(EmulatedDevice(total_memory=2 << 30), given=("total_memory",))
    assert override.apply(listed) == EmulatedDevice(total_memory=2 << 30, schedule="adversarial")
    assert override.apply(None) is None  # a line the list keeps off the device stays off
    assert DeviceOverride(emulate_all=True).apply(None) == EmulatedDevice()


USERS_CUDA_TEST = '''
import torch


def test_sizes_its_kv_cache_from_the_device():
    free, total = torch.cuda.mem_get_info()
    assert total == 6 * 1024**3, total
    blocks = torch.empty(int(free * 0.0001) // 2, dtype=torch.bfloat16, device="cuda")
    assert blocks.is_cuda and torch.cuda.memory_allocated() >= blocks.numel() * 2
'''

USERS_LIST = """
version: 0.0.1
cuda_on_cpu:
- emulate_cuda: {total_memory: 6GiB}
  tests:
  - tests/test_runner.py
"""


def test_a_users_list_runs_its_cuda_tests_under_the_device_it_sizes(tmp_path):
    import torch

    from harness.emulation import emulation_active

    if torch.cuda.is_available() or emulation_active() is not None:
        pytest.skip("the emulated device is what a list gets without CUDA")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_runner.py").write_text(USERS_CUDA_TEST)
    (tmp_path / "test-db").mkdir()
    (tmp_path / "test-db" / "mine.yml").write_text(USERS_LIST)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "run", "cuda_on_cpu", "--json", "run.json",
                           "--", "-p", "no:cacheprovider"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--emulate-cuda --emulate-cuda-memory=6GiB" in proc.stdout
    assert json.loads((tmp_path / "run.json").read_text())["suites"]["tests"]["passed"] == 1
