"""The generators' graph holders of a capture begun inside a compiled backend's code.

The emulated device runs a compiled callable with its placement mode off; a capture begun there
(the piecewise runner captures its pieces so) made the holders each build makes at the capture's
start as a cuda `empty` with nothing to place it, which the CPU cannot run."""

from __future__ import annotations

import torch


def test_a_capture_begun_inside_a_compiled_backends_code_makes_its_holders(cuda_kind):
    """A backend whose compiled callable captures a graph (the piecewise runner's pieces do): the
    device's compiled code runs with the placement mode off, and the holders each build makes at
    the capture's start (per state up to 2.11, per capture on 2.12-2.13) were a cuda `empty` the
    CPU could not run."""
    import torch._dynamo

    torch._dynamo.reset()
    x = torch.ones(4, device="cuda")

    def backend(gm, example_inputs):
        def run(*args):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = gm(*args)
            x.fill_(2.0)
            graph.replay()
            return out
        return run

    compiled = torch.compile(lambda t: t * 2 + 1, backend=backend)
    assert compiled(x).tolist() == [5.0, 5.0, 5.0, 5.0]
    torch._dynamo.reset()
