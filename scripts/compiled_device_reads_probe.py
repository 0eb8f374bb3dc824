"""CUDA's own answers for the cases of docs/fidelity.md's "Device reads inside compiled code,
stream calls and the accelerator" (branch compiled10): a device tensor's `device`, `is_cuda`,
`is_cpu`, `get_device()` and `type()` read inside a `torch.compile`d function, a factory given
that device, a host and a device input through one compiled branch (and its recompile count);
`torch.cuda.current_stream()`, `default_stream()`, stream contexts, `wait_stream` and events in a
fullgraph compile; `torch._C._get_accelerator()` and the distributed callers that read it (FSDP's
device of a module on the host, fully_shard's default mesh, a barrier at a device index).

Plain torch, no harness: run it on a GPU, `python scripts/compiled_device_reads_probe.py` (all
cases, each in a process of its own) or with case names. Each case prints one line `case: answer`,
with the emulated device's answer in brackets; compare with `python
scripts/compiled_device_reads_probe.py --emulate` on a machine without a GPU."""

from __future__ import annotations

import datetime
import sys
import tempfile

import probe_cases
import torch
import torch._dynamo.testing

CASES, case = probe_cases.registry()

_outcome = probe_cases.outcome


def _reads(t):
    branch = t + 1 if t.is_cuda else t - 1
    return (branch, t.device.type, t.device.index, t.get_device(), t.is_cuda, t.is_cpu, t.type(),
            str(t.device))


@case
def device_reads_inside_compiled_code():
    x = torch.zeros(2, device="cuda")
    answers = {}
    for backend in ("inductor", "aot_eager", "eager"):
        for fullgraph in (True, False):
            torch._dynamo.reset()
            out = _outcome(lambda: (lambda r: (r[0].tolist(), *r[1:]))(
                torch.compile(_reads, backend=backend, fullgraph=fullgraph)(x)))
            answers[f"{backend}/{'fg' if fullgraph else 'nofg'}"] = out[:110]
    return (f"{answers} (emulated: ok ([1.0, 1.0], 'cuda', 0, 0, True, False, "
            f"'torch.cuda.FloatTensor', 'cuda:0') for each)")


@case
def values_made_inside_compiled_code():
    def made(t):
        on_device, on_host = t * 2, (t * 2).cpu()
        back = on_host.to("cuda")
        return (on_device.device.type, on_host.device.type, back.device.type, on_host.is_cuda,
                on_host.get_device(), back.is_cuda)

    torch._dynamo.reset()
    x = torch.zeros(2, device="cuda")
    return (f"{_outcome(lambda: torch.compile(made, fullgraph=True)(x))} (emulated: ok ('cuda', "
            f"'cpu', 'cuda', False, -1, True))")


@case
def factories_given_a_tensors_device():
    def factories(t):
        return (torch.arange(2, device=t.device, dtype=t.dtype) + t, torch.ones(2, device=t.device),
                torch.zeros(2).to(t.device))

    torch._dynamo.reset()
    x = torch.zeros(2, device="cuda")
    outs = torch.compile(factories, fullgraph=True)(x)
    return f"{[str(o.device) for o in outs]} (emulated: ['cuda:0', 'cuda:0', 'cuda:0'])"


@case
def a_factory_given_a_host_tensors_device_beside_device_inputs():
    def mixed(t, h):
        return t + 1, torch.ones(2, device=h.device)

    torch._dynamo.reset()
    out = torch.compile(mixed, fullgraph=True)(torch.zeros(2, device="cuda"), torch.zeros(2))
    return (f"{str(out[1].device)} (emulated: 'cuda:0', listed: a torch.device reading cpu in the "
            f"trace is resolved to the graph's device)")


@case
def host_and_device_inputs_through_one_branch():
    counter = torch._dynamo.testing.CompileCounter()

    def branch(t):
        return t + 1 if t.device.type == "cuda" else t - 1

    compiled = torch.compile(branch, backend=counter)
    device, host = torch.zeros(2, device="cuda"), torch.zeros(2)
    answers = [compiled(a).tolist() for a in (device, host, device, host)]
    return (f"{answers}, frames {counter.frame_count} (emulated: [[1.0, 1.0], [-1.0, -1.0], "
            f"[1.0, 1.0], [-1.0, -1.0]], frames 2)")


@case
def stream_calls_in_a_fullgraph_compile():
    side = torch.cuda.Stream()

    def current(t):
        return t + 1, torch.cuda.current_stream()

    def fork_join(t, s):
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            y = t * 2
        torch.cuda.current_stream().wait_stream(s)
        return y + 1

    def new_stream(t):
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            y = t * 2
        torch.cuda.current_stream().wait_stream(s)
        return y + 1

    def events(t):
        e = torch.cuda.Event()
        e.record()
        y = t * 3
        e.wait()
        torch.cuda.current_stream().record_event().synchronize()
        return y

    def default(t):
        return t + 1, torch.cuda.default_stream()

    x = torch.ones(2, device="cuda")
    answers = {}
    for backend in ("eager", "aot_eager", "inductor"):
        for name, fn, args in (("current", current, (x,)), ("fork_join", fork_join, (x, side)),
                               ("new_stream", new_stream, (x,)), ("events", events, (x,)),
                               ("default_stream", default, (x,))):
            torch._dynamo.reset()
            compiled = torch.compile(fn, backend=backend, fullgraph=True)
            answers[f"{backend}/{name}"] = _outcome(lambda: (lambda r: (
                r[0].tolist(), type(r[1]).__name__, r[1].stream_id) if isinstance(r, tuple)
                else r.tolist())(compiled(*args)))[:90]
    return (f"{answers} (emulated, torch 2.13 and 2.14.1: eager and aot_eager ok, the current "
            f"stream an 'AcceleratorStream' (a torch.Stream) of id 0; default_stream: Unsupported: "
            f"torch.* op returned non-Tensor, read from dynamo's builder; inductor: current ok, "
            f"fork_join NameError: name 'default_stream' is not defined, new_stream NameError: "
            f"name 'stream1' ..., events UnboundLocalError ... 'arg0_1', listed)")


def _gloo_world_of_one():
    import torch.distributed as dist

    store = tempfile.mkdtemp()
    dist.init_process_group("gloo", init_method=f"file://{store}/store", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    return dist


@case
def the_accelerator_and_its_distributed_callers():
    dist = _gloo_world_of_one()
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

        module = torch.nn.Linear(2, 2)
        calls = {
            "_get_accelerator()": lambda: str(torch._C._get_accelerator()),
            "FSDP compute_device": lambda: str(FullyShardedDataParallel(
                torch.nn.Linear(2, 2)).compute_device),
            "fully_shard mesh": lambda: (fully_shard(module), module.weight.device_mesh.device_type,
                                         str(module.weight.device))[1:],
            "barrier(device_ids=[0])": lambda: dist.barrier(device_ids=[0]),
        }
        answers = {n: _outcome(c)[:90] for n, c in calls.items()}
    finally:
        dist.destroy_process_group()
    return (f"{answers} (emulated: 'cuda'; 'cuda:0'; ('cuda', 'cpu'): the sharded parameters "
            f"read cpu, listed; ok None)")


if __name__ == "__main__":
    probe_cases.run(CASES, __file__, sys.argv[1:], answer=probe_cases.whole_answer)
