"""CUDA's own answers for the cases of the seventh sweep of public runtimes and bugs (docs/fidelity.md,
"A seventh sweep of public runtimes and bugs"): syncs inside CUDA kernels the device's dispatch sees
whole (`mode` of long slices, `linspace`/`logspace` of tensor bounds, `index_fill` of a tensor
value, `x[mask] = device value`), the deterministic-algorithms mode (kernels without a deterministic
form, cuBLAS's workspace check), CUDA-only answers (`lstsq`'s driver, `nll_loss`'s device assert,
factories given a 0-dim device number, arguments CUDA wants on the host: `tensor_split`'s,
`randint_like`'s, packed sequences' lengths), and ops found to agree (quantile of a device `q`, embedding
backward and renorm, `index_put_` accumulating, sorting and selection ops) in a capture.

Plain torch, no harness: run it on a GPU, `python scripts/seventh_sweep_probe.py` (all cases, each
in a process of its own, since a refused capture or a device assert can leave CUDA's context
unusable, and CUDA reads CUBLAS_WORKSPACE_CONFIG once per process) or with case names. Each case
prints one line `case: answer`, with the emulated device's answer in brackets; compare with
`python scripts/seventh_sweep_probe.py --emulate` on a machine without a GPU."""

from __future__ import annotations

import contextlib
import os
import sys

import probe_cases
import torch
import torch.nn.functional as F

CASES, case = probe_cases.registry()

_outcome = probe_cases.outcome
_capture_verdict = probe_cases.capture_verdict
_flags_a_sync = probe_cases.flags_a_sync
_seeded = probe_cases.seeded


@contextlib.contextmanager
def _deterministic(warn_only: bool = False):
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


def _short(text: str) -> str:
    return text[:70]


# --- syncs inside kernels --------------------------------------------------------------------

@case
def mode_of_long_slices_in_capture():
    """TensorModeKernel.cpp: slices over 2048 values go to thrust on the host, one slice at a time."""
    x = _seeded(4, 4).round()  # 16 values: 129 copies make one slice of 2064, 128 of 2048
    long, short = (lambda: torch.mode(x.flatten().repeat(129))), (lambda: torch.mode(x.flatten().repeat(128)))
    return (f"2064 values: {_capture_verdict(long)}; 2048: {_capture_verdict(short)}; sync flagged "
            f"(2064, 2048): {_flags_a_sync(long)}, {_flags_a_sync(short)} (decided from source; "
            f"emulated: refused as a sync, invalidated; captured; True, False)")


@case
def item_inside_linspace_logspace_index_fill_in_capture():
    """TensorFactories.cpp and TensorAdvancedIndexing.cpp call `.item()` on the tensor arguments."""
    b = _seeded(2)
    y = _seeded(4, 4)
    index = torch.arange(2, device="cuda")
    return (f"linspace: {_capture_verdict(lambda: torch.linspace(b[0], b[1], 5, device='cuda'))}; "
            f"logspace: {_capture_verdict(lambda: torch.logspace(b[0], 1.0, 5, device='cuda'))}; "
            f"index_fill: {_capture_verdict(lambda: y.index_fill(0, index, b[0]))}; index_fill of a "
            f"number: {_capture_verdict(lambda: y.index_fill(0, index, -1.0))}; sync flagged "
            f"(linspace, index_fill): {_flags_a_sync(lambda: torch.linspace(b[0], b[1], 5, device='cuda'))}, "
            f"{_flags_a_sync(lambda: y.index_fill(0, index, b[0]))} (decided from source; emulated: "
            f"refused as a sync, invalidated x3; captured; True, True)")


def _assigned(y: torch.Tensor, value) -> torch.Tensor:
    z = y.clone()
    z[y > 0] = value
    return z


@case
def mask_assigned_a_device_value_in_capture():
    """PyTorch #170262; canDispatchToMaskedFill takes a host value only."""
    y = _seeded(4, 4)
    device_value, host_value = torch.tensor(-1.0, device="cuda"), torch.tensor(-1.0)
    return (f"device value: {_capture_verdict(lambda: _assigned(y, device_value))}; host value: "
            f"{_capture_verdict(lambda: _assigned(y, host_value))}; number: "
            f"{_capture_verdict(lambda: _assigned(y, -1.0))}; sync flagged (device, host): "
            f"{_flags_a_sync(lambda: _assigned(y, device_value))}, "
            f"{_flags_a_sync(lambda: _assigned(y, host_value))} (decided from source; emulated: "
            f"refused as a sync, invalidated; captured; captured; True, False)")


# --- the deterministic-algorithms mode -------------------------------------------------------

def _ids(x: torch.Tensor) -> torch.Tensor:
    return (x.abs() * 10).long().remainder(4).flatten()


def _backward(forward):
    def call(x):
        leaf = x.detach().requires_grad_()
        forward(leaf).sum().backward()
    return call


_ALERTED = {
    "cumsum": lambda x: torch.cumsum(x, 1),
    "multinomial(3, replacement)": lambda x: torch.multinomial(x.softmax(1), 3, replacement=True),
    "histc": lambda x: torch.histc(x, 4, -1, 1),
    "bincount(weights)": lambda x: torch.bincount(_ids(x), x.flatten()),
    "median(dim)": lambda x: torch.median(x, 1),
    "put_(accumulate)": lambda x: x.clone().put_(_ids(x)[:8], x[0, :8], accumulate=True),
    "scatter_reduce(prod)": lambda x: torch.ones(4, device="cuda").scatter_reduce(
        0, _ids(x), x.flatten(), "prod"),
    "cross_entropy 4-d": lambda x: F.cross_entropy(x.view(1, 4, 4, 4), _ids(x)[:16].view(1, 4, 4)),
    "bilinear backward": _backward(lambda x: F.interpolate(x.view(1, 1, 4, 16), scale_factor=2,
                                                           mode="bilinear")),
    "adaptive_avg_pool2d backward": _backward(lambda x: F.adaptive_avg_pool2d(x.view(1, 1, 4, 16), 3)),
    "reflection pad backward": _backward(lambda x: F.pad(x.view(1, 4, 16), (2, 2), mode="reflect")),
    "grid_sample backward": _backward(lambda x: F.grid_sample(
        x.view(1, 1, 4, 16), x[0, :8].reshape(1, 2, 2, 2).tanh(), align_corners=False)),
    "embedding_bag max backward": _backward(
        lambda x: F.embedding_bag(_ids(x)[:8].view(2, 4), x, mode="max")),
}
_QUIET = {
    "cumsum int": lambda x: torch.cumsum(_ids(x), 0),
    "multinomial(1, replacement)": lambda x: torch.multinomial(x.softmax(1), 1, replacement=True),
    "multinomial(3)": lambda x: torch.multinomial(x.softmax(1), 3),
    "scatter_reduce(sum)": lambda x: torch.zeros(4, device="cuda").scatter_reduce(
        0, _ids(x), x.flatten(), "sum"),
    "index_add": lambda x: torch.zeros(4, 16, device="cuda").index_add(0, _ids(x)[:4], x),
    "scatter_add_": lambda x: torch.zeros(4, device="cuda").scatter_add_(0, _ids(x), x.flatten()),
    "cross_entropy 2-d": lambda x: F.cross_entropy(x, _ids(x)[:4]),
    "nearest backward": _backward(lambda x: F.interpolate(x.view(1, 1, 4, 16), scale_factor=2)),
}


@case
def deterministic_mode_alerts():
    """The kernels' callers in alertNotDeterministic, as torch.use_deterministic_algorithms lists them."""
    x = _seeded(4, 16)
    with _deterministic():
        answers = {name: _outcome(lambda: call(x)).split(" does not")[0][:60]
                   for name, call in _ALERTED.items()}
    return (f"{answers} (measured on an H100, torch 2.11: cumsum, multinomial and bilinear backward "
            f"ok; emulated: the same, and a RuntimeError with each other kernel's caller: "
            f"_histc_cuda, _bincount_cuda, median CUDA with indices output, put_, "
            f"scatter_reduce_cuda_prod_, nll_loss2d_forward_out_cuda_template, "
            f"adaptive_avg_pool2d_backward_cuda, reflection_pad1d_backward_out_cuda, "
            f"grid_sampler_2d_backward_cuda, embedding_bag_backward_cuda_max)")


@case
def deterministic_mode_quiet_ops():
    x = _seeded(4, 16)
    with _deterministic():
        answers = {name: _outcome(lambda: call(x) is not None or True)[:40]
                   for name, call in _QUIET.items()}
    return f"{answers} (emulated: every one ok)"


@case
def deterministic_mode_matmul_without_cublas_config():
    """Context::alertCuBLASConfigNotDeterministic; CUDA reads the variable at the first gemm."""
    os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    x = _seeded(4, 16)
    with _deterministic():
        mm, mv = _outcome(lambda: x @ x.mT), _outcome(lambda: torch.mv(x, x[0]))
    return (f"mm: {_short(mm)}; mv: {_short(mv)} (measured on an H100, torch 2.11: mm ok, the "
            f"check gone from torch; emulated: ok for both)")


@case
def deterministic_mode_matmul_with_cublas_config():
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    x = _seeded(4, 16)
    with _deterministic():
        mm = _outcome(lambda: (x @ x.mT).shape)
    return f"mm: {mm} (emulated: ok torch.Size([4, 4]))"


# --- CUDA-only answers -----------------------------------------------------------------------

@case
def lstsq_driver_and_fields():
    """BatchLinearAlgebra.cpp: `gels` only on CUDA, and its default there."""
    a, b = _seeded(6, 3), _seeded(6, 2, seed=1)
    answer = torch.linalg.lstsq(a, b)
    return (f"rank {tuple(answer.rank.shape)}, singular_values {tuple(answer.singular_values.shape)}, "
            f"residuals {tuple(answer.residuals.shape)}; gelsd: "
            f"{_short(_outcome(lambda: torch.linalg.lstsq(a, b, driver='gelsd')))}; made-up name: "
            f"{_short(_outcome(lambda: torch.linalg.lstsq(a, b, driver='fictitious')))}; in a capture: "
            f"{_capture_verdict(lambda: torch.linalg.lstsq(a, b))} (decided from source; emulated: "
            f"rank (0,), singular_values (0,), residuals (2,); RuntimeError: torch.linalg.lstsq: "
            f"`driver` other than `gels` is not supported on CUDA, twice; refused as a sync, "
            f"invalidated)")


@case
def cross_entropy_of_a_target_out_of_range():
    """LossNLL.cu asserts each class index on the device."""
    scores = _seeded(4, 3)
    answer = _outcome(lambda: F.cross_entropy(scores, torch.tensor([0, 1, 5, 2], device="cuda")).item())
    return (f"{answer[:90]} (decided from source; emulated: DeviceAssertError: CUDA error: "
            f"device-side assert triggered)")


@case
def factories_of_a_device_number():
    n, x = torch.tensor(4, device="cuda"), torch.tensor(0.5, device="cuda")
    devices = {name: str(call().device) for name, call in {
        "arange(n)": lambda: torch.arange(n), "full((2,), x)": lambda: torch.full((2,), x),
        "zeros(n)": lambda: torch.zeros(n), "randint(n, (3,))": lambda: torch.randint(n, (3,)),
        "linspace(x, x + 1, 5)": lambda: torch.linspace(x, x + 1, 5)}.items()}
    return (f"{devices}; arange(n, device='cuda') in a capture: "
            f"{_capture_verdict(lambda: torch.arange(n, device='cuda'))} (decided from the argument "
            f"parser; emulated: cpu for each; refused as a sync, invalidated)")


@case
def host_arguments_and_packed_sequences():
    """TensorShape.cpp, TensorFactories.cpp, PackedSequence.cpp check these arguments' device."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    x, n = torch.arange(8.0, device="cuda"), torch.tensor(2, device="cuda")
    lstm = torch.nn.LSTM(4, 5).cuda()
    steps = _seeded(3, 2, 4)
    packed = pack_padded_sequence(steps, torch.tensor([3, 2]))
    padded, lengths = pad_packed_sequence(lstm(packed)[0])
    return (f"tensor_split: {_short(_outcome(lambda: torch.tensor_split(x, n)))}; randint_like: "
            f"{_short(_outcome(lambda: torch.randint_like(x, n)))}; pack of device lengths: "
            f"{_short(_outcome(lambda: pack_padded_sequence(steps, torch.tensor([3, 2], device='cuda'))))}; "
            f"of host lengths: data {packed.data.device}, batch sizes {packed.batch_sizes.device}, "
            f"padded {padded.device}, lengths {lengths.device} (decided from source; emulated: "
            f"RuntimeError: tensor_split expected tensor_indices_or_sections to be on cpu, but it's "
            f"on cuda:0; RuntimeError: high must be a scalar tensor and on CPU; RuntimeError: "
            f"'lengths' argument should be a 1D CPU int64 tensor, but got 1D cuda:0 Long tensor; "
            f"cuda:0, cpu, cuda:0, cpu)")


# --- found to agree ---------------------------------------------------------------------------

@case
def quantile_of_a_device_q_in_capture():
    """Sorting.cpp range-checks q on the host for cpu tensors only."""
    x, q = _seeded(4, 33), torch.tensor([0.1, 0.9], device="cuda")
    return (f"quantile: {_capture_verdict(lambda: torch.quantile(x, q, dim=1))}; nanquantile: "
            f"{_capture_verdict(lambda: x.nanquantile(q[0]))}; sync flagged: "
            f"{_flags_a_sync(lambda: torch.quantile(x, q, dim=1))} (emulated: captured; captured; False)")


@case
def embedding_backward_and_renorm_in_capture():
    """EmbeddingBackwardKernel.cu counts segments on the device; embedding_renorm_cuda_ too."""
    table = torch.nn.Embedding(100, 16).cuda()
    renormed = torch.nn.Embedding(100, 16, max_norm=1.0).cuda()
    few = torch.randint(0, 100, (64,), generator=torch.Generator().manual_seed(0)).cuda()
    many = torch.randint(0, 100, (4000,), generator=torch.Generator().manual_seed(1)).cuda()

    def backward(ids):
        def step():
            table.zero_grad(set_to_none=False)
            table(ids).sum().backward()
        return step

    backward(few)()
    return (f"backward of 64 ids: {_capture_verdict(backward(few))}; of 4000 (the sorting path): "
            f"{_capture_verdict(backward(many))}; max_norm forward: "
            f"{_capture_verdict(lambda: renormed(few))} (emulated: captured x3)")


@case
def sorting_selection_and_accumulation_in_capture():
    x = _seeded(8, 3000)
    ids = torch.randint(0, 5, (8,), generator=torch.Generator().manual_seed(0)).cuda()
    cases = {
        "kthvalue": lambda: torch.kthvalue(x, 5, 1),
        "median(dim)": lambda: torch.median(x, 1),
        "median()": lambda: torch.median(x),
        "topk(2000)": lambda: torch.topk(x, 2000, 1),
        "sort(stable)": lambda: torch.sort(x, dim=1, stable=True),
        "index_put_(accumulate)": lambda: torch.zeros(5, 3000, device="cuda").index_put_(
            (ids,), x, accumulate=True),
        "randperm(1000)": lambda: torch.randperm(1000, device="cuda"),
    }
    return f"{ {name: _capture_verdict(call) for name, call in cases.items()} } (emulated: all captured)"


if __name__ == "__main__":
    probe_cases.run(CASES, __file__, sys.argv[1:], answer=probe_cases.whole_answer)
