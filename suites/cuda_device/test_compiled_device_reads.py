"""A device tensor's `device`, `is_cuda`, `is_cpu`, `get_device()` and `type()` read inside a
`torch.compile`d function answer cuda, as on CUDA. Dynamo answers them from the fake tensors it
traces, which on the emulated device are the cpu tensors the device's tensors are: until
2026-12-07 compiled code read cpu, None and -1 there, so `if x.is_cuda:` and transformers'
`hidden_states.device.type == "cuda"` took the host's branch where eager code took the device's."""

from __future__ import annotations

import pytest
import torch

BACKENDS = ["inductor", "aot_eager", "eager"]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _reads(t):
    branch = t + 1 if t.is_cuda else t - 1
    return (branch, t.device.type, t.device.index, t.get_device(), t.is_cuda, t.is_cpu, t.type(),
            str(t.device))


@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "breaks_allowed"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_device_tensors_device_reads_cuda_inside_compiled_code(cuda_kind, backend, fullgraph):
    x = torch.zeros(2, device="cuda")
    branch, *answers = torch.compile(_reads, backend=backend, fullgraph=fullgraph)(x)
    assert answers == ["cuda", 0, 0, True, False, "torch.cuda.FloatTensor", "cuda:0"]
    assert branch.is_cuda and branch.cpu().tolist() == [1.0, 1.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_values_made_inside_compiled_code_read_where_they_live(cuda_kind, backend):
    def made(t):
        on_device, on_host = t * 2, (t * 2).cpu()
        back = on_host.to("cuda")
        return (on_device.device.type, on_host.device.type, back.device.type, on_host.is_cuda,
                on_host.get_device(), back.is_cuda)

    x = torch.zeros(2, device="cuda")
    assert torch.compile(made, backend=backend, fullgraph=True)(x) == (
        "cuda", "cpu", "cuda", False, -1, True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_factory_given_a_device_tensors_device_makes_device_memory(cuda_kind, backend):
    def factories(t):
        return (torch.arange(2, device=t.device, dtype=t.dtype) + t,
                torch.ones(2, device=t.device), t.new_zeros(2), torch.zeros(2).to(t.device))

    x = torch.zeros(2, device="cuda")
    outs = torch.compile(factories, backend=backend, fullgraph=True)(x)
    assert [o.is_cuda for o in outs] == [True] * 4
    assert [o.cpu().tolist() for o in outs] == [[0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]


def test_a_device_context_entered_with_a_tensors_index_is_entered(cuda_kind):
    def on_its_device(t):
        with torch.cuda.device(t.device.index):
            return t + torch.cuda.current_device(), torch.cuda.current_device()

    x = torch.zeros(2, device="cuda")
    out, inside = torch.compile(on_its_device, backend="eager", fullgraph=True)(x)
    assert inside == 0 and out.is_cuda


def test_host_and_device_inputs_each_take_their_own_branch(cuda_kind):
    counter = torch._dynamo.testing.CompileCounter()

    def branch(t):
        return t + 1 if t.device.type == "cuda" else t - 1

    compiled = torch.compile(branch, backend=counter)
    device, host = torch.zeros(2, device="cuda"), torch.zeros(2)
    answers = [compiled(device).tolist(), compiled(host).tolist(), compiled(device).tolist(),
               compiled(host).tolist()]
    assert answers == [[1.0, 1.0], [-1.0, -1.0], [1.0, 1.0], [-1.0, -1.0]]
    assert counter.frame_count == 2  # a device input and a host one: two traces, as on CUDA


def test_a_modules_device_branch_takes_the_device_path(cuda_kind):
    class Norm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(4))

        def forward(self, hidden_states):
            # transformers' shape: a fused kernel where the device is cuda, a fallback elsewhere
            if hidden_states.device.type == "cuda" and self.weight.is_cuda:
                return hidden_states * self.weight * 2
            return hidden_states * self.weight

    module = Norm().cuda()
    x = torch.ones(4, device="cuda")
    out = torch.compile(module, fullgraph=True)(x)
    assert out.cpu().tolist() == module(x).cpu().tolist() == [2.0] * 4
