"""The graph sanitizer's draws (emulation/sanitizer_draws.py): a random op captured while a state
other than the default generator's own was swapped in (`graphsafe_set_state`, as AOTAutograd's
graph-safe rng does around a checkpointed backward) draws from that state at each replay, and the
state in use before the replay is in use after it. On a GPU the rows run over CUDA's own
generators, which is what the sanitizer draws from; on a CPU over the emulated device's."""

from __future__ import annotations

import torch

from harness.emulation.sanitizer_draws import SanitizerDraws

RAND = torch.ops.aten.rand.default


def _first_draws(state: torch.Generator, generator: torch.Generator) -> torch.Tensor:
    """What `state` draws first, its own position left as it was."""
    in_use = generator.graphsafe_get_state()
    generator.graphsafe_set_state(state.clone_state())
    try:
        return torch.rand(4, device="cuda")
    finally:
        generator.graphsafe_set_state(in_use)


def test_a_replayed_draw_comes_from_the_state_in_use_at_capture(cuda_kind):
    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    generator.manual_seed(7)
    swapped = generator.clone_state()
    swapped.manual_seed(123)
    expected_swapped = _first_draws(swapped, generator)
    expected_own = _first_draws(generator.graphsafe_get_state(), generator)
    draws = SanitizerDraws(torch.device("cuda", torch.cuda.current_device()))
    own = generator.graphsafe_get_state()
    generator.graphsafe_set_state(swapped)  # during the capture
    state = draws.source(RAND, ([4],), {"device": torch.device("cuda")})
    generator.graphsafe_set_state(own)  # the capture put it back
    assert state is not None
    (step, args, kwargs), = draws.replay_steps([(torch.rand, (4,), {"device": "cuda"})], RAND,
                                               ([4],), {}, None, state)
    assert torch.equal(step(*args, **kwargs), expected_swapped)
    assert torch.equal(torch.rand(4, device="cuda"), expected_own)  # its own state, untouched


def test_an_op_that_draws_nothing_is_left_as_recorded(cuda_kind):
    draws = SanitizerDraws(torch.device("cuda", torch.cuda.current_device()))
    assert draws.source(torch.ops.aten.mul.Tensor, (torch.ones(2, device="cuda"), 2), {}) is None
