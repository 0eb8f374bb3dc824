"""`torch.cuda.set_sync_debug_mode("error")`: which operations CUDA flags as making the host wait.

Each case runs on the emulated device, natively and in the graph sanitizer (`cuda_kind`), so a GPU
run shows CUDA's own verdict beside the emulated device's. Before sync_debug.py the emulated
device flagged only host reads and copies to the host: `nonzero`, mask indexing and blocking copies
to the device passed, where CUDA raises.
"""

from __future__ import annotations

import warnings

import pytest
import torch

MESSAGE = "called a synchronizing CUDA operation"


def _x():
    return torch.arange(6, device="cuda", dtype=torch.float32)


# (name, operation on x, whether CUDA flags it)
CASES = [
    ("item", lambda x: x[0].item(), True),
    ("cpu", lambda x: x.cpu(), True),
    ("nonzero", lambda x: x.nonzero(), True),
    ("mask index", lambda x: x[x > 2], True),
    ("masked_select", lambda x: torch.masked_select(x, x > 2), True),
    ("unique", lambda x: torch.unique(x), True),
    ("where with one argument", lambda x: torch.where(x > 2), True),
    ("repeat_interleave without output_size", lambda x: torch.repeat_interleave(x.long()[:3]), True),
    ("copy to the device from pageable memory", lambda x: torch.ones(6).to("cuda"), True),
    ("copy_ from pageable memory", lambda x: x.copy_(torch.ones(6)), True),
    ("copy to the device from pinned memory, blocking", lambda x: torch.ones(6).pin_memory().to("cuda"), True),
    ("torch.tensor of host data on the device", lambda x: torch.tensor([1.0, 2.0], device="cuda"), True),
    ("torch.as_tensor of host data on the device", lambda x: torch.as_tensor([1.0], device="cuda"), True),
    ("Stream.synchronize", lambda x: torch.cuda.current_stream().synchronize(), True),
    ("torch.equal of two tensors", lambda x: torch.equal(x, x.clone()), True),
    ("bincount", lambda x: torch.bincount(x.long()), True),
    ("argwhere", lambda x: torch.argwhere(x), True),
    ("nonzero_static", lambda x: torch.nonzero_static(x, size=3), False),
    ("mask assignment of a scalar", lambda x: x.clone().__setitem__(x > 2, 0.0), False),
    ("index with a device index", lambda x: x[torch.zeros(2, dtype=torch.long, device="cuda")], False),
    ("copy to the device from pinned memory, non_blocking",
     lambda x: torch.ones(6).pin_memory().to("cuda", non_blocking=True), False),
    ("copy to the host, non_blocking", lambda x: x.to("cpu", non_blocking=True), False),
    ("topk", lambda x: x.topk(2), False),
    ("torch.equal of a tensor with itself", lambda x: torch.equal(x, x), False),
    ("Event.synchronize", lambda x: torch.cuda.current_stream().record_event().synchronize(), False),
    ("Stream.query", lambda x: torch.cuda.current_stream().query(), False),
    ("torch.tensor of a device tensor", lambda x: torch.tensor(x, device="cuda"), False),
    ("torch.cuda.synchronize", lambda x: torch.cuda.synchronize(), False),
]


@pytest.mark.parametrize("name, operation, flagged", CASES, ids=[c[0] for c in CASES])
def test_error_mode_flags_what_cuda_flags(cuda_kind, name, operation, flagged):
    x = _x()
    pinned_warmup = torch.ones(6).pin_memory()  # pinning itself is no sync; keep it outside
    del pinned_warmup
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        if flagged:
            with pytest.raises(RuntimeError, match=MESSAGE):
                operation(x)
        else:
            operation(x)
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_warn_mode_warns_once_for_a_syncing_op_and_runs_it(cuda_kind):
    x = _x()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = x.nonzero()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert [str(w.message).split(" (Triggered")[0] for w in caught] == [MESSAGE]
    assert out.flatten().tolist() == [1, 2, 3, 4, 5]


def test_the_default_mode_flags_nothing(cuda_kind):
    x = _x()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert x[x > 2].tolist() == [3.0, 4.0, 5.0]
        torch.ones(2).to("cuda")
