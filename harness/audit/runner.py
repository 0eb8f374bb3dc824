"""Runs the audit: one forked process per architecture, `jobs` at a time, each with a timeout,
progress on stderr. A process that crashes or hangs costs its own row only.

Each child is forked from the thread that called `run_audit`, with the parent's objects frozen
from the child's collector: a child must never run the destructor of something it inherited
whose threads live in the parent only (a gloo process group that a destroyed FSDP run left
behind joins its worker threads when freed, and that join hangs or crashes a child). Forked from
another thread, the child would drop the caller's thread state (CPython clears every other
thread's state at a fork), and with it whatever that state alone held."""

from __future__ import annotations

import contextlib
import fnmatch
import gc
import json
import os
import multiprocessing
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TextIO

from harness.audit.classify import CRASHED, TIMEOUT, Row, audit_architecture
from harness.audit.tiny import Architecture, causal_lm_architectures

@dataclass(frozen=True)
class AuditResult:
    """Rows of one audit run and where they come from (versions, date, commit, backend, dtype)."""

    meta: dict
    rows: list[Row] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"meta": dict(self.meta), "rows": [r.to_dict() for r in self.rows]}

    @classmethod
    def from_dict(cls, data: dict) -> AuditResult:
        return cls(meta=dict(data["meta"]), rows=[Row.from_dict(r) for r in data["rows"]])

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> AuditResult:
        return cls.from_dict(json.loads(Path(path).read_text()))


def select(patterns: list[str] | None) -> list[Architecture]:
    """Architectures whose model_type or class name matches one of the glob patterns, in any case
    (all if none); a pattern matching nothing is a ValueError naming it."""
    archs = causal_lm_architectures()
    if not patterns:
        return archs
    chosen = []
    for pattern in patterns:
        # Any case: `--arch Llama` finds llama.
        matched = [a for a in archs if fnmatch.fnmatchcase(a.model_type.lower(), pattern.lower())
                   or fnmatch.fnmatchcase(a.class_name.lower(), pattern.lower())]
        if not matched:
            raise ValueError(f"--arch {pattern!r} matches no causal LM architecture of transformers "
                             f"(model types such as {', '.join(a.model_type for a in archs[:5])}, ...)")
        chosen += [a for a in matched if a not in chosen]
    return chosen


class AuditInterrupted(Exception):
    """The run was stopped (Ctrl-C, SIGTERM) before every architecture had its row; `result` holds
    the rows done, its meta marked incomplete with how many were left."""

    def __init__(self, result: AuditResult):
        super().__init__(f"audit interrupted with {result.meta['remaining']} of {result.meta['total']} "
                         f"architectures left")
        self.result = result


@dataclass(frozen=True)
class _Children:
    """The live children of one run, so that an interrupt can kill them, and whether it did."""

    live: set = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)

    def stop(self) -> None:
        with self.lock:
            self.stopping.set()
            for child in self.live:
                child.kill()


def run_audit(archs: list[Architecture], *, dtype: str, backend: str, jobs: int = 2,
              timeout_s: float = 180.0, progress: TextIO | None = sys.stderr,
              checkpoint: Path | None = None, done: list[Row] = (),
              done_meta: dict | None = None, emulate_cuda: bool = False) -> AuditResult:
    """Audit `archs`, skipping those with a row in `done` (a resumed run, whose provenance
    `done_meta` is kept under meta `resumed_from`, earliest first). With `emulate_cuda`, each child
    runs inside `harness.emulate_cuda()` with the model on "cuda" (meta `emulate_cuda` true); a
    resumed run keeps the mode of the rows it resumes. With `checkpoint`, the
    result so far is rewritten there after every row (meta `complete` false and `remaining` until
    the last), so a run killed midway keeps its rows. An interrupt (KeyboardInterrupt) kills the
    children and raises AuditInterrupted carrying the partial result."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    if done and done_meta is not None and bool(done_meta.get("emulate_cuda", False)) != emulate_cuda:
        raise ValueError(f"the rows to resume ran with emulate_cuda={bool(done_meta.get('emulate_cuda'))}, "
                         f"this run has emulate_cuda={emulate_cuda}: resume in the same mode")
    preload()
    started = time.perf_counter()
    wanted = {a.model_type for a in archs}
    rows: dict[str, Row] = {r.model_type: r for r in done if r.model_type in wanted}
    todo = [a for a in archs if a.model_type not in rows]
    earlier = []
    if rows and done_meta:
        earlier = list(done_meta.get("resumed_from", [])) + [
            {key: done_meta.get(key, "?") for key in ("date", "commit", "torch", "transformers", "machine")}]
    fallbacks: list[str] = []
    children = _Children()

    def result() -> AuditResult:
        meta = provenance(dtype=dtype, backend=backend, emulate_cuda=emulate_cuda, jobs=jobs,
                          wall_s=round(time.perf_counter() - started, 1), total=len(archs),
                          remaining=len(archs) - len(rows), complete=len(rows) == len(archs),
                          resumed=len(archs) - len(todo), start_method_fallbacks=len(fallbacks),
                          **({"resumed_from": earlier} if earlier else {}))
        return AuditResult(meta, [rows[a.model_type] for a in archs if a.model_type in rows])

    # The pool's threads only wait for children; each child is started here, in this thread.
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        mode = _Mode(dtype, backend, emulate_cuda)
        queued, waiting = list(todo), set()
        count = len(archs) - len(todo)
        while queued or waiting:
            while queued and len(waiting) < jobs:
                launched = _start_one(queued.pop(0), mode, children)
                waiting.add(pool.submit(_finish, launched, timeout_s, children))
            finished, waiting = wait(waiting, return_when=FIRST_COMPLETED)
            for future in finished:
                count += 1
                row, fallback = future.result()
                rows[row.model_type] = row
                if fallback:
                    fallbacks.append(row.model_type)
                    if progress is not None:
                        progress.write(f"harness audit: {fallback}\n")
                if checkpoint is not None:
                    result().save(checkpoint)
                if progress is not None:
                    where = f" at step {row.step}" if row.step is not None else ""
                    progress.write(f"[{count}/{len(archs)}] {row.model_type}: {row.verdict}{where} "
                                   f"({row.seconds:.1f}s)\n")
                    progress.flush()
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        children.stop()
        pool.shutdown(wait=True)
        partial = result()
        if checkpoint is not None:
            partial.save(checkpoint)
        raise AuditInterrupted(partial) from None
    pool.shutdown(wait=True)
    if fallbacks and progress is not None:
        progress.write(f"harness audit: {len(fallbacks)} architectures ran in spawned instead of forked "
                       f"children (fork refused): {', '.join(fallbacks)}\n")
    return result()


@dataclass(frozen=True)
class _Mode:
    """How every child of one run audits: the dtype, the backend, inside emulate_cuda() or not."""

    dtype: str
    backend: str
    emulate_cuda: bool


def _start(arch: Architecture, mode: _Mode, log_name: str, children: _Children):
    """Start the child for one architecture; returns (process, pipe end, fallback note or "").
    Forking is cheap (imports are shared) but unsafe once CUDA is in use, so cuda runs spawn (and so
    do emulate_cuda runs on a machine with a GPU: the graph sanitizer uses the real device); a fork
    the parent refuses (filelock's fork-safety check raises RuntimeError) falls back to spawn, noted."""
    import torch

    uses_gpu = mode.backend == "cuda" or (mode.emulate_cuda and torch.cuda.is_available())
    methods = ["spawn"] if uses_gpu else ["fork", "spawn"]
    note = ""
    for method in methods:
        context = multiprocessing.get_context(method)
        receive, send = context.Pipe(duplex=False)
        child = context.Process(target=_child, args=(arch, mode, send, log_name), daemon=True)
        with _interrupts_held(), children.lock:
            if children.stopping.is_set():
                raise KeyboardInterrupt("audit stopping")
            try:
                with _inherited_objects_kept_from_the_childs_collector() if method == "fork" \
                        else contextlib.nullcontext():
                    child.start()
            except RuntimeError as error:
                if method == methods[-1]:
                    raise
                receive.close()
                send.close()
                note = f"{arch.model_type}: fork refused ({error}); spawned instead"
                continue
            children.live.add(child)
        send.close()
        return child, receive, note
    raise RuntimeError(f"no start method in {methods} could start a child for {arch.model_type}")


_INTERRUPTS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _interrupts_held():
    """SIGINT and SIGTERM that arrive while a child is started are handled after it is started
    (and counted among the live children, which an interrupt kills). os.fork runs Python hooks
    (logging's, filelock's) whose exceptions it only prints: a KeyboardInterrupt raised by a
    signal handler inside one was lost, and the audit ran on. Handlers run in the main thread
    only, so elsewhere there is nothing to hold."""
    previous = [signal.getsignal(number) for number in _INTERRUPTS]
    if threading.current_thread() is not threading.main_thread() or None in previous:
        yield  # None: a handler installed outside Python, which signal.signal cannot put back
        return
    arrived = []
    for number in _INTERRUPTS:
        signal.signal(number, lambda number, frame: arrived.append(number))
    try:
        yield
    finally:
        for number, handler in zip(_INTERRUPTS, previous):
            signal.signal(number, handler)
        for number in arrived:
            signal.raise_signal(number)


@contextlib.contextmanager
def _inherited_objects_kept_from_the_childs_collector():
    """Freezes the parent's objects (gc.freeze) while a child is forked, so that the child's
    collector never frees what it inherited. The parent's garbage may hold C++ objects whose
    threads live in the parent only: a gloo process group left in a reference cycle (FSDP's
    FlatParamHandle keeps one after destroy_process_group) joins its worker threads in its
    destructor, and in a child, which has none of them, that join hangs or crashes."""
    frozen_by_someone_else = gc.get_freeze_count() > 0
    gc.freeze()
    try:
        yield
    finally:
        if not frozen_by_someone_else:  # unfreezing would undo their freeze too
            gc.unfreeze()


@dataclass(frozen=True)
class _Started:
    """A started child: its architecture and mode, the process, the pipe end its row comes on,
    the log its output goes to, when it started and the fallback note of its start."""

    arch: Architecture
    mode: _Mode
    child: BaseProcess
    receive: Connection
    log: TextIO
    start: float
    note: str


def _start_one(arch: Architecture, mode: _Mode, children: _Children) -> _Started:
    """One child per architecture; the parent has imported torch and transformers' shared modules
    already (`preload`), so a forked child pays only for its own model's module."""
    start = time.perf_counter()
    log = tempfile.NamedTemporaryFile(mode="w+", prefix="audit-", suffix=".log")
    try:
        child, receive, note = _start(arch, mode, log.name, children)
    except BaseException:
        log.close()
        raise
    return _Started(arch, mode, child, receive, log, start, note)


def _finish(started: _Started, timeout_s: float, children: _Children) -> tuple[Row, str]:
    """The row of a started child: the one it sent, or a crash or timeout of its own."""
    arch, mode, child, receive, note = (started.arch, started.mode, started.child, started.receive,
                                        started.note)

    def failed(verdict: str, detail: str) -> Row:
        return Row(arch.model_type, arch.class_name, mode.dtype, mode.backend, verdict, detail, None,
                   round(time.perf_counter() - started.start, 2))

    with started.log as log:
        try:
            if receive.poll(timeout_s):
                try:
                    return Row.from_dict(receive.recv()), note
                except EOFError:
                    pass  # the child died before sending its row
            else:
                child.kill()
                return failed(TIMEOUT, f"no verdict within {timeout_s:.0f}s"), note
        finally:
            child.join(10)
            receive.close()
            with children.lock:
                children.live.discard(child)
        log.seek(0)
        last = (log.read().strip().splitlines() or ["no output"])[-1]
        return failed(CRASHED, f"exit status {child.exitcode}: {last[:300]}"), note


def _child(arch: Architecture, mode: _Mode, send, log_path: str) -> None:
    # A forked child has the handlers that held the parent's interrupts (_interrupts_held).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # The child's chatter (transformers warnings) goes to a file the parent reads if it crashes.
    with open(log_path, "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    import torch

    torch.set_num_threads(1)
    if mode.emulate_cuda:
        import contextlib

        from harness import emulate_cuda
        from harness.emulation import emulation_active

        # Entered here, in the child: the emulation is per process. A child forked from a parent
        # already inside emulate_cuda() (a pytest session under --emulate-cuda) has it already.
        with contextlib.nullcontext() if emulation_active() else emulate_cuda():
            row = audit_architecture(arch, mode.dtype, mode.backend, device="cuda")
    else:
        row = audit_architecture(arch, mode.dtype, mode.backend)
    send.send(row.to_dict())
    send.close()


def preload() -> None:
    """Import what every child needs, once, before forking: torch, the harness and transformers'
    shared modules (importing one model class pulls in most of them)."""
    import transformers

    transformers.StaticCache  # noqa: B018 (attribute access imports the lazy module)
    transformers.LlamaForCausalLM  # noqa: B018


def provenance(**extra) -> dict:
    """Where this audit ran (harness.provenance), with `extra` (dtype, backend, jobs, ...)."""
    from harness.provenance import git_commit, machine_line, utc_now, versions

    return {"date": utc_now(), "commit": git_commit(), **versions(), "machine": machine_line(), **extra}


