"""A force module inside a host application (OpenMM's PyTorch plugin) replays its captured graph on
torch's current stream while the application writes the positions on its own CUDA stream (openmm-
torch #122, from torchmd-net #220: "By asking torch for a CUDA stream we risk a later OpenMM
workload to run on a different one and thus access non-ready data"). Nothing orders the replay
after the application's write: on CUDA the forces come from stale positions, now and then; the
harness's stream tracking reports the race. Fixed: the replay runs on the application's stream,
wrapped with `torch.cuda.ExternalStream(handle)`, which is that stream to CUDA (capture itself
stays on a side stream, as CUDA requires)."""

from __future__ import annotations

import pytest
import torch

from harness.emulation import track_stream_races
from harness.emulation.tracking import RaceError

ATOMS = 1 << 10


class TorchForce:
    def __init__(self, context_stream_handle: int, *, on_context_stream: bool) -> None:
        self.handle = context_stream_handle
        self.on_context_stream = on_context_stream
        self.positions = torch.zeros(ATOMS, 3, device="cuda")
        self.graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph):
            self.forces = -2.0 * self.positions  # a harmonic well

    def compute(self) -> torch.Tensor:
        if self.on_context_stream:
            with torch.cuda.stream(torch.cuda.ExternalStream(self.handle)):
                self.graph.replay()
                return self.forces.clone()
        self.graph.replay()
        return self.forces.clone()


def _step(on_context_stream: bool) -> torch.Tensor:
    context_stream = torch.cuda.Stream()  # the application's stream (it hands torch the handle)
    force = TorchForce(context_stream.cuda_stream, on_context_stream=on_context_stream)
    try:
        with track_stream_races():
            with torch.cuda.stream(context_stream):  # the integrator moves the atoms
                force.positions.fill_(0.5)
            forces = force.compute()
            torch.cuda.synchronize()
            return forces
    finally:
        torch.cuda.synchronize()


@pytest.mark.strict_races
def test_a_replay_on_torchs_stream_races_the_applications_write():
    with pytest.raises(RaceError, match="test_replay_off_the_applications_stream.py"):
        _step(on_context_stream=False)


@pytest.mark.strict_races
def test_a_replay_on_the_applications_stream_sees_its_positions():
    assert _step(on_context_stream=True).eq(-1.0).all()
