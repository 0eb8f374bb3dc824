"""The audit forks its children from a parent (a pytest worker, a long script) whose leftovers may
own threads that a child lacks: a gloo process group that outlived destroy_process_group joins its
worker threads when freed, and freed in a child that join hung or crashed it. FSDP leaves such a
group in a reference cycle (its FlatParamHandle) and in the calling thread's state (DTensor's
thread-local sharding cache). A child must free neither: the parent's objects are frozen from the
child's collector, and the child is forked from the calling thread, whose state it keeps (CPython
clears the state of every thread but the forking one)."""

from __future__ import annotations

import gc
import os
import multiprocessing
import threading

import pytest

from harness.audit import runner
from harness.audit.classify import AGREES, Row
from harness.audit.runner import run_audit
from harness.audit.tiny import Architecture


def _collect_then_answer(arch, mode, send, log_path) -> None:
    gc.collect()  # what the child's collector does at its next full collection
    send.send(Row(arch.model_type, arch.class_name, mode.dtype, mode.backend, AGREES).to_dict())
    send.close()


def _left_in_a_cycle(group) -> None:
    holder = type("Holder", (), {})()
    holder.me, holder.group = holder, group


def _left_in_this_threads_state(group) -> threading.local:
    held = threading.local()
    held.group = group
    return held


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork here")
@pytest.mark.parametrize("leave", [_left_in_a_cycle, _left_in_this_threads_state])
def test_a_forked_child_frees_nothing_of_the_parents(leave, tmp_path, monkeypatch):
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("a torch without distributed")
    monkeypatch.setattr(runner, "_child", _collect_then_answer)
    kept, was_enabled = [], gc.isenabled()
    gc.disable()  # a cycle outlives the fork, as in a worker whose last full collection was earlier
    try:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
        kept.append(leave(dist.group.WORLD))
        dist.destroy_process_group()
        result = run_audit([Architecture("llama", "LlamaForCausalLM")], dtype="float32",
                           backend="emulated", jobs=1, timeout_s=30, progress=None)
    finally:
        kept.clear()
        if was_enabled:
            gc.enable()
        gc.collect()  # the group's threads are joined here, in the process that has them
    assert [(r.verdict, r.detail) for r in result.rows] == [(AGREES, "")], result.rows
    assert gc.get_freeze_count() == 0  # the parent's objects are collectable again


_INTERRUPTED_WHILE_FORKING = """
import os, signal
from harness.audit import runner
from harness.audit.classify import AGREES, Row
from harness.audit.tiny import Architecture

def answer(arch, mode, send, log_path):
    send.send(Row(arch.model_type, arch.class_name, mode.dtype, mode.backend, AGREES).to_dict())
    send.close()

runner._child = answer
# as in a terminal: a process started in the background by a shell inherits SIGINT ignored
signal.signal(signal.SIGINT, signal.default_int_handler)
# Ctrl-C arriving while os.fork runs its hooks (their exceptions are only printed)
os.register_at_fork(after_in_parent=lambda: signal.raise_signal(signal.SIGINT))
try:
    runner.run_audit([Architecture("llama", "LlamaForCausalLM")], dtype="float32", backend="emulated",
                     jobs=1, timeout_s=30, progress=None)
except runner.AuditInterrupted as stopped:
    print("interrupted,", stopped.result.meta["remaining"], "left")
else:
    print("finished")
"""


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork here")
def test_an_interrupt_while_the_caller_forks_stops_the_audit():
    # Forked from the caller's (main) thread, a child's fork is where the caller's Ctrl-C or
    # SIGTERM may land; raised inside os.fork's hooks, it was printed and lost, the audit ran on.
    import subprocess
    import sys

    ran = subprocess.run([sys.executable, "-c", _INTERRUPTED_WHILE_FORKING], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "interrupted, 1 left", ran.stderr
