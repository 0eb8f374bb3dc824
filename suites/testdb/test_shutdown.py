"""`harness run` stopped by SIGTERM (a CI cancellation) or SIGINT (Ctrl-C): the signal reaches its
pytest process and the xdist worker, nothing of the run survives, the partial table is printed
without a traceback, exit 143 or 130."""

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.testdb.processes import group_members

BLOCKING_TESTS = '''
import os
import threading


def test_done_first():
    pass


def test_blocks_until_stopped():
    # Tell the outer test who is running (worker pid, its controller's pid), then wait for an
    # event that never comes.
    with open(os.environ["STARTED_FIFO"], "w") as fifo:
        fifo.write(f"{os.getpid()} {os.getppid()}\\n")
    threading.Event().wait()
'''

LIST = """
version: 0.0.1
mine:
- tests:
  - tests/test_blocking.py
  - tests/test_blocking.py::test_done_first -k done
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


# SIGINT takes the same path as SIGTERM once it reaches the run; it runs nightly (a subprocess run).
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143),
                                          pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow)],
                         ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_every_process_of_the_run_and_prints_the_partial_table(tmp_path, signum, code):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_blocking.py").write_text(BLOCKING_TESTS)
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists" / "mine.yml").write_text(LIST)
    fifo = tmp_path / "started"
    os.mkfifo(fifo)
    # Read and write ends held here, so the reader never sees end-of-file before the test writes.
    reader = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["STARTED_FIFO"] = str(fifo)
    harness = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", "mine", "--test-db", "lists",
                                "--", "-n", "1", "-p", "no:cacheprovider"],
                               cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ready, _, _ = select.select([reader], [], [], 300)
        assert ready, "the blocking test never started"
        worker, controller = map(int, os.read(reader, 100).split())
        assert alive(worker) and alive(controller)
        harness.send_signal(signum)
        out, _ = harness.communicate(timeout=300)
    finally:
        os.close(reader)
        if harness.poll() is None:
            harness.kill()
            harness.wait()

    assert harness.returncode == code, out
    assert f"[harness] stopped by {signum.name}" in out
    assert "run 1/2 interrupted: tests/test_blocking.py" in out
    assert 'run 2/2 not started: tests/test_blocking.py::test_done_first -k "done"' in out
    assert any(line.startswith("total ") for line in out.splitlines()), out
    assert not alive(worker) and not alive(controller)
    assert group_members(controller) == []  # the pytest process group: controller and workers
    assert "Traceback" not in out and "PluggyTeardownRaisedWarning" not in out
