"""A `torch.cuda.make_graphed_callables` user reloading weights by rebinding (`param.data = new`,
as an RL weight sync does; vLLM #40390, SGLang #4961): the graphed module keeps replaying the
captured weights, whose memory is freed. The harness refuses the next call, naming the
make_graphed_callables line and the rebinding line. Fixed: the new weights are copied into the
captured parameters, and the graphed call computes with them."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import FreedMemoryError


def _graphed_linear() -> tuple[torch.nn.Linear, object, torch.Tensor]:
    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 4).cuda()
    x = torch.randn(2, 4, device="cuda")
    return linear, torch.cuda.make_graphed_callables(linear, (x,)), x


def test_weights_rebound_under_a_graphed_callable_are_refused_at_the_next_call():
    linear, graphed, x = _graphed_linear()
    with torch.no_grad():
        linear.weight.data = torch.randn(4, 4, device="cuda")
    taken = torch.zeros(4, 4, device="cuda")  # the allocator hands the old weights' memory on
    with pytest.raises(FreedMemoryError, match=r"make_graphed_callables[\s\S]*weight\.data = ") as caught:
        graphed(x)
    assert "test_graphed_callable_weights_rebound.py" in str(caught.value)
    del taken


def test_weights_copied_into_the_captured_parameters_reach_the_graphed_call():
    linear, graphed, x = _graphed_linear()
    new = torch.randn(4, 4, device="cuda")
    with torch.no_grad():
        linear.weight.copy_(new)
    assert torch.allclose(graphed(x), x @ new.T + linear.bias)
