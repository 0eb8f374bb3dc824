"""A compiled graph that calls a solver, `matrix_exp` or the CTC loss, met by a capture.

Inductor lowers these ops as fallback kernels that call the aten op, whose CUDA kernel reads
device data on the host inside itself as in eager code (`matrix_exp`'s norms: Copy.cu's refusal,
the capture still valid). `linalg.inv` and `solve` are their `_ex` op then `_linalg_check_errors`
(`infos.any().item()`, a sync that invalidates the capture), a check that returns nothing: where
torch does not register it as an effectful op (torch 2.11) AOTAutograd drops it from the graph as
dead code, and CUDA captures the compiled solver, measured on an H100 (torch 2.11, 2026-12-07);
where torch does (2.13 and later) the graph keeps it and the call fails as the eager op fails.
Under mode="reduce-overhead" cudagraph trees capture the compiled code at its second call, so that
call fails as the eager op fails in a capture, or the trees record and replay it. A direct
`torch.cuda.graph` around a compiled call gets the same verdicts: the compiled code, compiled at a
warm-up before the capture, runs into it (on the emulated device too: the capture's modes step
aside for dynamo, and leave the torch function modes, which its guards check, as they were). The
`cuda_kind` rows show CUDA's own verdicts on a GPU; refused native captures run in a process of
their own, since an invalidated capture leaves CUDA's state broken behind it."""

from __future__ import annotations

from typing import Callable

import pytest
import torch

from harness import torch_internals
from suites.cuda_device._own_process import in_a_process_of_its_own

NOT_PERMITTED = "operation not permitted when stream is capturing"
PAGEABLE_COPY = "Cannot copy between CPU and CUDA tensors during CUDA graph capture"

Op = Callable[[torch.Tensor], torch.Tensor]


def _compiled_graphs_keep_the_solver_check() -> bool:
    effect_of = torch_internals.optional_name("op_effect")
    return effect_of is not None and effect_of("aten::_linalg_check_errors") is not None


CHECKED = NOT_PERMITTED if _compiled_graphs_keep_the_solver_check() else None
# name: (a function of a positive-definite 4x4 matrix, CUDA's text in a capture or None)
CASES: dict[str, tuple[Op, str | None]] = {
    "linalg.inv": (lambda a: torch.linalg.inv(a) * 2, CHECKED),
    "linalg.solve": (lambda a: torch.linalg.solve(a, a[:, :1]) + 1, CHECKED),
    "linalg.matrix_exp": (lambda a: torch.linalg.matrix_exp(a / 10) + 1, PAGEABLE_COPY),
    "linalg.inv_ex": (lambda a: torch.linalg.inv_ex(a)[0] * 2, None),
}


def _matrix(seed: int) -> torch.Tensor:
    m = torch.randn(4, 4, generator=torch.Generator().manual_seed(seed))
    return (m @ m.mT + 4 * torch.eye(4)).to("cuda")


def _texts(error: BaseException) -> str:
    """The error's text and those of the errors it was raised during (capture_end's, on CUDA,
    raised while the op's own error left the capture)."""
    texts = []
    while error is not None and len(texts) < 8:
        texts.append(f"{type(error).__name__}: {error}")
        error = error.__cause__ or error.__context__
    return "\n".join(texts)


def _reduce_overhead_outcome(name: str) -> tuple[str | None, bool | None]:
    """What the trees' recording call raised (as text), else whether the replays that follow
    give the eager answers for new inputs."""
    op = CASES[name][0]
    torch._dynamo.reset()
    compiled = torch.compile(op, mode="reduce-overhead")
    a = _matrix(0)
    for call in range(3):  # a warm-up, the recording, a replay
        torch.compiler.cudagraph_mark_step_begin()
        try:
            out = compiled(a if call < 2 else _matrix(1))
        except RuntimeError as error:
            return _texts(error), None
    return None, bool(torch.allclose(out, op(_matrix(1)), atol=1e-4))


def _direct_capture_outcome(name: str, backend: str) -> str | None:
    """What a compiled call inside `torch.cuda.graph` raised, as text (None: captured)."""
    op = CASES[name][0]
    torch._dynamo.reset()
    compiled = torch.compile(op, backend=backend)
    a = _matrix(0)
    compiled(a)
    torch.cuda.synchronize()
    caller_stream = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            compiled(a)
    except RuntimeError as error:
        return _texts(error)
    finally:
        torch.cuda.set_stream(caller_stream)
    return None


TREES_REFUSED = "the graph sanitizer refuses inductor's CUDA graphs by name"
COMPILED_CODE_EAGER = ("the graph sanitizer runs a compiled call inside its capture as eager code "
                       "(compiled kernels would run on the GPU unseen by its recorder; "
                       "docs/fidelity.md)")


def _skip_in_the_sanitizer(cuda_kind: str, why: str) -> None:
    if cuda_kind == "sanitizer":
        pytest.skip(why)


def _on(cuda_kind: str, name: str, function: str, *args):
    if cuda_kind == "native" and CASES[name][1] is not None:
        return in_a_process_of_its_own(__file__, function, name, *args)
    return globals()[function](name, *args)


@pytest.mark.parametrize("name", sorted(CASES))
def test_reduce_overhead_records_a_compiled_op_as_the_capture_of_its_graph_allows(cuda_kind, name):
    _skip_in_the_sanitizer(cuda_kind, TREES_REFUSED)
    raised, replayed_right = _on(cuda_kind, name, "_reduce_overhead_outcome")
    if CASES[name][1] is None:
        assert raised is None and replayed_right, raised
    else:
        assert raised is not None and CASES[name][1] in raised, raised


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
@pytest.mark.parametrize("name", ["linalg.inv", "linalg.solve", "linalg.matrix_exp"])
def test_a_compiled_call_inside_a_capture_gets_the_verdict_of_its_graph(cuda_kind, name, backend):
    if CASES[name][1] is None:  # the compiled graph dropped the eager op's sync
        _skip_in_the_sanitizer(cuda_kind, COMPILED_CODE_EAGER)
    raised = _on(cuda_kind, name, "_direct_capture_outcome", backend)
    if CASES[name][1] is None:
        assert raised is None, raised
    else:
        assert raised is not None and CASES[name][1] in raised, raised


def _compiled_code_in_a_capture(backend_name: str) -> tuple[int, int]:
    """How often the backend compiled a function warmed up before a capture, and how often its
    compiled code ran, after a call inside the capture and a replay."""
    compiles, runs = [], []

    def backend(gm, example_inputs):
        compiles.append(backend_name)
        inner = torch._dynamo.lookup_backend(backend_name)(gm, example_inputs)

        def run(*args):
            runs.append(1)
            return inner(*args)
        return run

    torch._dynamo.reset()
    compiled = torch.compile(lambda a: torch.nn.functional.one_hot(a.argmax(-1), 4) * a,
                             backend=backend)
    a = _matrix(0)
    compiled(a)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = compiled(a)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, torch.nn.functional.one_hot(a.argmax(-1), 4) * a)
    return len(compiles), len(runs)


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_a_compiled_call_inside_a_capture_runs_the_code_compiled_before_it(cuda_kind, backend):
    """Its guards hold inside the capture (no recompile: torch 2.14 refuses to compile during a
    capture), and the compiled code runs there, not the function's eager code."""
    _skip_in_the_sanitizer(cuda_kind, COMPILED_CODE_EAGER)
    assert _compiled_code_in_a_capture(backend) == (1, 2)
