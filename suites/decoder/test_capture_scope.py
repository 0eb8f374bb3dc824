"""d. Every warmup forward runs under the warmup scope and every capture under the serving scope,
and after each capture the ranks line up at the same graph."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import pytest

from harness.runtime.decode.policy import CapturePolicy


class ScopeLog:
    """A capture-scope factory that logs, for every model forward, the innermost scope and whether
    the forward was being captured."""

    def __init__(self, engine_backend) -> None:
        self.backend = engine_backend
        self.stack: list[str] = []
        self.forwards: list[tuple[str | None, bool]] = []

    @contextlib.contextmanager
    def __call__(self, name: str):
        self.stack.append(name)
        try:
            yield
        finally:
            self.stack.pop()

    def on_forward(self, module, args) -> None:
        self.forwards.append((self.stack[-1] if self.stack else None, self.backend.is_capturing()))


def scope_violations(forwards: list[tuple[str | None, bool]]) -> list[str]:
    """Forwards that ran under the wrong scope: captures outside "serving", eager ones outside "warmup"."""
    problems = []
    for i, (scope, capturing) in enumerate(forwards):
        wanted = "serving" if capturing else "warmup"
        if scope != wanted:
            problems.append(f"forward {i} ({'capture' if capturing else 'eager'}) ran under {scope!r}, "
                            f"not {wanted!r}")
    return problems


def _capture_logging_scopes(make_engine, graph_backend, **overrides) -> ScopeLog:
    log = ScopeLog(graph_backend)
    engine = make_engine(capture_scope=log, **overrides)
    graphs = engine.decode_graphs
    step = graphs.step
    if step is not None:
        # The compiled path: the decode graphs warm up and capture the compiled step, which never
        # calls the model's forward (the hook still sees the eager forwards, the workspace's).
        def logged_step(*args):
            log.on_forward(None, args)
            return step(*args)

        graphs.step = logged_step
    handle = engine.model.register_forward_pre_hook(log.on_forward)
    try:
        engine.prepare_graphs()
    finally:
        handle.remove()
        graphs.step = step
    return log


def test_warmups_run_under_warmup_and_captures_under_serving(make_engine, graph_backend):
    for single_pass in (False, True):
        log = _capture_logging_scopes(make_engine, graph_backend, single_pass_capture=single_pass)
        captures = sum(capturing for _, capturing in log.forwards)
        assert captures == 2 * 4  # four sizes in each phase
        assert captures < len(log.forwards)
        problems = scope_violations(log.forwards)
        assert not problems, "forwards under the wrong scope:\n" + "\n".join(problems)


@dataclass(frozen=True)
class NoCaptureScope(CapturePolicy):
    """Planted bug: captures run under no scope of their own."""

    def capture_scope(self, scopes):
        return contextlib.nullcontext()


def test_a_capture_without_its_scope_is_caught(make_engine, graph_backend):
    log = _capture_logging_scopes(make_engine, graph_backend, single_pass_capture=True,
                                  capture_policy=NoCaptureScope())
    problems = scope_violations(log.forwards)
    assert len(problems) == 8 and "(capture) ran under 'warmup', not 'serving'" in problems[0]


class PeerAtAnotherKey:
    """A two-rank Comm whose peer answers like this rank, except that it lines up at the next
    smaller decode graph: the ranks capture their keys in different orders."""

    rank, world_size = 0, 2

    def allgather_object(self, obj):
        if isinstance(obj, str) and obj.startswith("decode[bs="):
            size = int(obj.removeprefix("decode[bs=").split(",")[0])
            return [obj, obj.replace(f"bs={size},", f"bs={max(size // 2, 1)},")]
        return [obj, obj]

    def barrier(self) -> None:
        return None


def test_ranks_lining_up_at_different_graphs_are_an_error_naming_both(make_engine):
    engine = make_engine(comm=PeerAtAnotherKey())
    with pytest.raises(RuntimeError, match=r"ranks lined up at different decode graphs: "
                                           r"\['decode\[bs=8,greedy\]', 'decode\[bs=4,greedy\]'\]"):
        engine.prepare_graphs()
