"""A compiled graph that calls a solver, `matrix_exp` or the CTC loss, met by a capture.

Inductor lowers these ops as fallback kernels that call the aten op, whose CUDA kernel reads
device data on the host inside itself as in eager code (`_linalg_check_errors`' `.item()`, a sync
that invalidates the capture) or copies from pageable host memory (`matrix_exp`'s norms: Copy.cu's
refusal, the capture still valid). Under mode="reduce-overhead" cudagraph trees capture the
compiled code at its second call, and that call fails as the eager op fails in a capture; the
`_ex` op with check_errors=False is captured and replayed. The emulated device ran the compiled
graph as one op of its own inside the trees' capture, the fallback kernels' aten calls unseen,
and captured all three. A direct `torch.cuda.graph` around a compiled call is refused on both.
The `cuda_kind` rows show CUDA's own verdicts on a GPU; refused native captures run in a process
of their own, since an invalidated capture leaves CUDA's state broken behind it."""

from __future__ import annotations

from typing import Callable

import pytest
import torch

from suites.cuda_device._own_process import in_a_process_of_its_own

NOT_PERMITTED = "operation not permitted when stream is capturing"
PAGEABLE_COPY = "Cannot copy between CPU and CUDA tensors during CUDA graph capture"

Op = Callable[[torch.Tensor], torch.Tensor]

# name: (a function of a positive-definite 4x4 matrix, CUDA's text in a capture or None)
CASES: dict[str, tuple[Op, str | None]] = {
    "linalg.inv": (lambda a: torch.linalg.inv(a) * 2, NOT_PERMITTED),
    "linalg.solve": (lambda a: torch.linalg.solve(a, a[:, :1]) + 1, NOT_PERMITTED),
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


def _on(cuda_kind: str, name: str, function: str, *args):
    if cuda_kind == "native" and CASES[name][1] is not None:
        return in_a_process_of_its_own(__file__, function, name, *args)
    return globals()[function](name, *args)


@pytest.mark.parametrize("name", sorted(n for n, (_, text) in CASES.items() if text))
def test_reduce_overhead_fails_at_the_recording_as_the_eager_op_fails_in_a_capture(cuda_kind, name):
    raised, _ = _on(cuda_kind, name, "_reduce_overhead_outcome")
    assert raised is not None and CASES[name][1] in raised, raised


def test_reduce_overhead_captures_the_unchecked_solver_and_replays_it(cuda_kind):
    raised, replayed_right = _on(cuda_kind, "linalg.inv_ex", "_reduce_overhead_outcome")
    assert raised is None and replayed_right, raised


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
@pytest.mark.parametrize("name", ["linalg.inv", "linalg.matrix_exp"])
def test_a_compiled_call_inside_a_capture_is_refused_as_the_eager_op(cuda_kind, name, backend):
    raised = _on(cuda_kind, name, "_direct_capture_outcome", backend)
    assert raised is not None and CASES[name][1] in raised, raised
