"""Ops whose CUDA kernel reads device data on the host inside itself, or does not, in a capture.

CUDA's solvers raise on a failed factorization after reading their info codes on the host
(`_linalg_check_errors`: `infos.any().item()`, a copy and a stream sync), so `linalg.solve`, `inv`,
`cholesky` and `lu_factor` are refused in a capture, while the `_ex` forms with check_errors=False
are captured (PyTorch #96632). Measured on an H100 (torch 2.11, 2026-12-07), others fail before
that read: the SVD (`svd`, `pinv`, the spectral norm) meets Copy.cu's pageable-copy refusal, and
cuSOLVER's eigensolvers return CUSOLVER_STATUS_INTERNAL_ERROR (`eigh` at `cusolverDnXsyevd`,
`eigvals` at `cusolverDnXgeev_bufferSize`), the capture invalidated behind them.
`linalg.matrix_exp` copies its matrices' 1-norms, and `histc` without a range the input's minimum
and maximum, to pageable host memory inside the kernel, and `ctc_loss` copies its lengths from
pageable host memory to the device (`at::tensor(target_lengths)`, LossCTC.cu; length tensors on
the device are first copied to the host), as does the grouped GEMM's fallback for other than bf16
operands (`offs.cpu()`, GroupedMMUtils.h; the emulated device called it a sync that invalidates the
capture): Copy.cu's refusal, which leaves the capture valid.
`repeat_interleave` given `output_size` reads nothing on the host and is captured. `isin` with
many test elements (TensorCompare.cpp's heuristic) sorts after `_unique`, which reads the number of
unique values on the host (PyTorch #130078), and `masked_fill` of a 0-dim device value passes it to
its kernel with `value.item()` (Indexing.cu): both refused as a sync, where the emulated device
captured them; with few test elements or a host value, they are captured. With many test elements
and assume_unique=True isin marks the last sorted element with a host scalar copied to the device
(`index_put_({-1}, invert)`), and `bincount` copies its input's minimum and maximum to the host
(SummaryOps.cu, `self.min().cpu()`): Copy.cu's refusal, measured on an H100 (torch 2.11), where the
emulated device captured the first and refused the second as a sync that invalidates the capture.
So is `mode` of slices over 2048 values (TensorModeKernel.cpp: a thrust sort and count per slice,
read on the host), where its fused kernel takes shorter slices on the device; `linspace` and
`logspace` of device bounds and `index_fill` of a 0-dim device value (`.item()` inside their
kernels); and `x[mask] = value` of a device value, which CUDA does not turn into masked_fill
(canDispatchToMaskedFill wants a host value) and indexes through the mask's `nonzero`; the emulated
device captured all four. So is `segment_reduce` by device `lengths` (SegmentReduce.cpp checks them
with `.item()` unless `unsafe=True`; by `offsets` it checks nothing), which the emulated device
captured, and `to_sparse` of a dense tensor (SparseTensor.cpp counts the entries with `nonzero()`),
whose capture the emulated device ended with a dense placeholder that its replay could not fill,
and `searchsorted` given a device `sorter` (BucketizationUtils.h checks its range with `aminmax()`
and `.item()`; measured on an H100, torch 2.11), which the emulated device captured. The emulated
device captured the copying kernels (the read happens inside a kernel its dispatch never sees, and
on host memory) and refused `ctc_loss` and the last as a sync that invalidates the capture (their
tags say dynamic output shape). The `cuda_kind` rows show CUDA's own verdicts on a GPU; refused
native captures run in a process of their own, since an invalidated capture leaves CUDA's state
broken behind it."""

from __future__ import annotations

import warnings
from typing import Callable

import pytest
import torch

from suites.cuda_device._own_process import in_a_process_of_its_own

NOT_PERMITTED = "operation not permitted when stream is capturing"
INVALIDATED = "operation failed due to a previous error during capture"
PAGEABLE_COPY = "Cannot copy between CPU and CUDA tensors during CUDA graph capture"
SYNC_FLAGGED = "called a synchronizing CUDA operation"

Op = Callable[[torch.Tensor, torch.Tensor], object]

# name: an op of a positive-definite 4x4 matrix `a` and a right-hand side `b` (4x2)
REFUSED_AS_A_SYNC: dict[str, Op] = {
    "linalg.solve": lambda a, b: torch.linalg.solve(a, b),
    "linalg.inv": lambda a, b: torch.linalg.inv(a),
    "linalg.cholesky": lambda a, b: torch.linalg.cholesky(a),
    "linalg.cholesky_ex check_errors=True": lambda a, b: torch.linalg.cholesky_ex(a, check_errors=True),
    "linalg.lu_factor": lambda a, b: torch.linalg.lu_factor(a),
    # 16 test elements against 16 elements: over numpy's heuristic (14), isin sorts after `_unique`
    "isin sorting many test elements": lambda a, b: torch.isin(a.flatten(), a.flatten() + 1),
    "Tensor.masked_fill of a device value": lambda a, b: a.masked_fill(a > 4, b[0, 0]),
    "Tensor.masked_fill_ of a device value": lambda a, b: a.clone().masked_fill_(a > 4, b[0, 0]),
    # one slice of 2064 values, over the 2048 of CUDA's fused kernel: thrust on the host per slice
    "mode of a slice over 2048 values": lambda a, b: torch.mode(a.round().flatten().repeat(129)),
    "linspace of device bounds": lambda a, b: torch.linspace(b[0, 0], b[1, 0], 5, device="cuda"),
    "logspace of a device bound": lambda a, b: torch.logspace(b[0, 0], 1.0, 5, device="cuda"),
    "Tensor.index_fill of a device value":
        lambda a, b: a.index_fill(0, torch.arange(2, device="cuda"), b[0, 0]),
    "boolean-mask assignment of a device value": lambda a, b: _assigned(a, b[0, 0]),
    # rows of 2 and 2 along dim 0: SegmentReduce.cpp checks device lengths with `.item()`
    "segment_reduce by device lengths":
        lambda a, b: torch.segment_reduce(a, "sum", lengths=torch.full((2,), 2, device="cuda")),
    # SparseTensor.cpp's dense_to_sparse counts the entries with `nonzero()`
    "Tensor.to_sparse of a dense tensor": lambda a, b: a.to_sparse(),
    # BucketizationUtils.h checks the sorter's range with `aminmax()` and `.item()`
    "searchsorted with a device sorter":
        lambda a, b: torch.searchsorted(b.mT[0].contiguous(), b.mT[1].contiguous(),
                                        sorter=b.mT[0].argsort()),
}
CUSOLVER_FAILED = "cusolver error: CUSOLVER_STATUS_INTERNAL_ERROR, when calling `"
# name: (an op, the cuSOLVER call CUDA names in its error inside a capture)
FAILED_IN_CUSOLVER: dict[str, tuple[Op, str]] = {
    "linalg.eigh": (lambda a, b: torch.linalg.eigh(a), "cusolverDnXsyevd"),
    "linalg.pinv hermitian=True": (lambda a, b: torch.linalg.pinv(a, hermitian=True),
                                   "cusolverDnXsyevd"),
    "linalg.eigvals": (lambda a, b: torch.linalg.eigvals(a), "cusolverDnXgeev_bufferSize"),
}


# A 0-dim host tensor, made before any capture: CUDA's masked_fill reads it in place.
_HOST_VALUE = torch.tensor(-1.0)


def _assigned(a: torch.Tensor, value) -> torch.Tensor:
    """`x[mask] = value`: index_put_ with a boolean mask, which CUDA turns into masked_fill_ for
    a number or a one-element host value (canDispatchToMaskedFill), and indexes through the mask's
    `nonzero` (a sync) for a device value."""
    assigned = a.clone()
    assigned[a > 4] = value
    return assigned


def _ctc_loss(a: torch.Tensor, input_lengths, target_lengths) -> torch.Tensor:
    """CTC loss of 4 time steps, a batch of 2 and 2 classes (made of `a`), one target each."""
    targets = torch.ones(2, 1, dtype=torch.long, device="cuda")
    return torch.nn.functional.ctc_loss(a.reshape(4, 2, 2).log_softmax(2), targets,
                                        input_lengths, target_lengths)


REFUSED_AS_A_PAGEABLE_COPY: dict[str, Op] = {
    "linalg.svd": lambda a, b: torch.linalg.svd(a),
    "linalg.pinv": lambda a, b: torch.linalg.pinv(a),
    "linalg.matrix_norm ord=2": lambda a, b: torch.linalg.matrix_norm(a, 2),
    "linalg.matrix_exp": lambda a, b: torch.linalg.matrix_exp(a / 10),
    "histc without a range": lambda a, b: torch.histc(a, bins=4),
    "ctc_loss with int-list lengths": lambda a, b: _ctc_loss(a, [4, 4], [1, 1]),
    "ctc_loss with host length tensors":
        lambda a, b: _ctc_loss(a, torch.full((2,), 4), torch.full((2,), 1)),
    "ctc_loss with device length tensors":
        lambda a, b: _ctc_loss(a, torch.full((2,), 4, device="cuda"),
                               torch.full((2,), 1, device="cuda")),
    # two groups of two rows; offsets made on the device (no host data in the capture)
    "_grouped_mm of float32 operands": lambda a, b: torch._grouped_mm(
        a, torch.stack((a, a.mT)), offs=torch.full((2,), 2, dtype=torch.int32, device="cuda").cumsum(
            0, dtype=torch.int32)),
    # SummaryOps.cu copies the values' minimum and maximum to the host (`self.min().cpu()`)
    "bincount of device values": lambda a, b: torch.bincount(a.flatten().abs().long(), minlength=8),
    # 16 test elements: isin sorts, and marks the last one with a host scalar copied to the device
    "isin sorting many unique test elements":
        lambda a, b: torch.isin(a.flatten(), a.flatten() + 1, assume_unique=True),
}
CAPTURED: dict[str, Op] = {
    "linalg.solve_ex": lambda a, b: torch.linalg.solve_ex(a, b)[0],
    "linalg.inv_ex": lambda a, b: torch.linalg.inv_ex(a)[0],
    "linalg.cholesky_ex": lambda a, b: torch.linalg.cholesky_ex(a)[0],
    "linalg.lu_factor_ex then lu_solve":
        lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor_ex(a)[:2], b),
    "linalg.det": lambda a, b: torch.linalg.det(a),
    # no kernel runs for an empty matrix (the op database's first svd sample, H100, torch 2.11)
    "linalg.svd of an empty matrix": lambda a, b: torch.linalg.svd(a[:0, :0])[1] + 1,
    "linalg.pinv of an empty matrix": lambda a, b: torch.linalg.pinv(a[:0, :0]),
    "linalg.matrix_exp of a 1x1 matrix": lambda a, b: torch.linalg.matrix_exp(a[:1, :1] / 10),
    "histc with a range": lambda a, b: torch.histc(a, bins=4, min=-20, max=20),
    "repeat_interleave with output_size":
        lambda a, b: torch.repeat_interleave((b[:, 0] > -100).long() * 2, output_size=8),
    "Tensor.repeat_interleave of repeats with output_size":
        lambda a, b: a.repeat_interleave(torch.full((4,), 2, device="cuda"), dim=0, output_size=8),
    "isin with few test elements": lambda a, b: torch.isin(a.flatten(), a[0] + 1),
    "Tensor.masked_fill of a host value": lambda a, b: a.masked_fill(a > 4, _HOST_VALUE),
    "Tensor.masked_fill of a number": lambda a, b: a.masked_fill(a > 4, -1.0),
    "mode of slices of at most 2048 values":
        lambda a, b: torch.mode(a.round().flatten().repeat(128)),
    "linspace of numbers": lambda a, b: torch.linspace(-1.0, 1.0, 5, device="cuda") * a[0, 0],
    "Tensor.index_fill of a number": lambda a, b: a.index_fill(0, torch.arange(2, device="cuda"), -1.0),
    "boolean-mask assignment of a number": lambda a, b: _assigned(a, -1.0),
    "boolean-mask assignment of a host value": lambda a, b: _assigned(a, _HOST_VALUE),
    "segment_reduce by offsets":
        lambda a, b: torch.segment_reduce(a, "max", offsets=torch.arange(0, 5, 2, device="cuda")),
    "searchsorted of a sorted sequence":
        lambda a, b: torch.searchsorted(b.mT[0].sort().values, b.mT[1].contiguous()),
    "segment_reduce by device lengths, unsafe=True":
        lambda a, b: torch.segment_reduce(a, "mean", lengths=torch.full((2,), 2, device="cuda"),
                                          unsafe=True),
}
OPS = {**REFUSED_AS_A_SYNC, **{name: op for name, (op, _) in FAILED_IN_CUSOLVER.items()},
       **REFUSED_AS_A_PAGEABLE_COPY, **CAPTURED}


def _operands(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    m = torch.randn(4, 4, generator=generator)
    a = m @ m.mT + 4 * torch.eye(4)
    return a.to("cuda"), torch.randn(4, 2, generator=generator).to("cuda")


def _outcome(name: str) -> tuple[list[str], str | None, bool | None]:
    """The op's errors inside the capture, what ending the capture raised, and (when it ended well)
    whether a replay on new operands gave the eager answer: as text a process can send back."""
    op = OPS[name]
    a, b = _operands(0)
    warmup = torch.cuda.Stream()  # the solver's handle and workspace exist before the capture
    warmup.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warmup):
        op(a, b)
    torch.cuda.current_stream().wait_stream(warmup)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    errors: list[str] = []
    ended = None
    result = None
    caller_stream = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph):
            try:
                result = op(a, b)
            except RuntimeError as error:
                errors.append(str(error))
    except RuntimeError as error:
        ended = str(error)
    finally:
        torch.cuda.set_stream(caller_stream)
    if ended is not None or errors:
        return errors, ended, None
    new_a, new_b = _operands(1)
    a.copy_(new_a)
    b.copy_(new_b)
    graph.replay()
    torch.cuda.synchronize()
    flat = [t for t in (result if isinstance(result, tuple) else (result,))]
    expected = op(new_a, new_b)
    expected = expected if isinstance(expected, tuple) else (expected,)
    return errors, ended, all(torch.allclose(r.float(), e.float(), atol=1e-4)
                              for r, e in zip(flat, expected))


def _outcome_on(cuda_kind: str, name: str):
    if cuda_kind == "native" and name not in CAPTURED:  # whatever CUDA's verdict, nothing left behind
        return in_a_process_of_its_own(__file__, "_outcome", name)
    return _outcome(name)


@pytest.mark.parametrize("name", sorted(REFUSED_AS_A_SYNC))
def test_an_op_reading_device_data_on_the_host_is_refused_as_a_sync(cuda_kind, name):
    errors, ended, _ = _outcome_on(cuda_kind, name)
    assert len(errors) == 1 and NOT_PERMITTED in errors[0], errors
    assert ended is not None and INVALIDATED in ended, ended


@pytest.mark.parametrize("name", sorted(FAILED_IN_CUSOLVER))
def test_an_eigensolver_fails_in_cusolver_and_invalidates_the_capture(cuda_kind, name):
    errors, ended, _ = _outcome_on(cuda_kind, name)
    call = FAILED_IN_CUSOLVER[name][1]
    assert len(errors) == 1 and errors[0].startswith(CUSOLVER_FAILED + call), errors
    assert ended is not None and INVALIDATED in ended, ended


@pytest.mark.parametrize("name", sorted(REFUSED_AS_A_PAGEABLE_COPY))
def test_a_kernel_copying_to_pageable_host_memory_is_refused_as_copy_cu_refuses(cuda_kind, name):
    errors, ended, _ = _outcome_on(cuda_kind, name)
    assert len(errors) == 1 and errors[0].startswith(PAGEABLE_COPY), errors
    assert ended is None, ended  # Copy.cu refuses before any CUDA call: the capture stays valid


@pytest.mark.parametrize("name", sorted(CAPTURED))
def test_an_op_that_reads_nothing_on_the_host_is_captured_and_follows_new_operands(cuda_kind, name):
    errors, ended, replayed_right = _outcome_on(cuda_kind, name)
    assert errors == [] and ended is None, (errors, ended)
    assert replayed_right


@pytest.mark.parametrize("name, flagged", [("linalg.inv", True), ("linalg.matrix_exp", True),
                                           ("histc without a range", True),
                                           ("linalg.inv_ex", False), ("histc with a range", False),
                                           ("repeat_interleave with output_size", False),
                                           ("isin sorting many test elements", True),
                                           ("isin with few test elements", False),
                                           ("isin sorting many unique test elements", True),
                                           ("bincount of device values", True),
                                           ("Tensor.masked_fill of a device value", True),
                                           ("Tensor.masked_fill of a host value", False),
                                           ("mode of a slice over 2048 values", True),
                                           ("mode of slices of at most 2048 values", False),
                                           ("linspace of device bounds", True),
                                           ("Tensor.index_fill of a device value", True),
                                           ("boolean-mask assignment of a device value", True),
                                           ("boolean-mask assignment of a host value", False),
                                           ("segment_reduce by device lengths", True),
                                           ("segment_reduce by offsets", False),
                                           ("searchsorted with a device sorter", True),
                                           ("searchsorted of a sorted sequence", False),
                                           ("Tensor.to_sparse of a dense tensor", True)])
def test_the_sync_debug_mode_flags_the_reads_inside_kernels(cuda_kind, name, flagged):
    a, b = _operands(0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        if flagged:
            with pytest.raises(RuntimeError, match=SYNC_FLAGGED):
                OPS[name](a, b)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                OPS[name](a, b)
    finally:
        torch.cuda.set_sync_debug_mode(0)
