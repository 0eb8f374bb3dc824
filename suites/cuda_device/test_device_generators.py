"""The device's random generators are CUDA's: each device has a default generator of its own holding
a seed and a Philox offset (`get_state()` 16 bytes: the seed as a uint64, then the offset), apart
from the cpu's generator; a random op moves the offset by what CUDA's kernel may consume
(calc_execution_policy: 4 per 256 * grid * unroll elements); a graph's replay draws fresh values at
the offsets eager draws would use and moves the offset by the graph's whole increment. The
`cuda_kind` rows run natively on a GPU too, where they are CUDA's own behaviour."""

from __future__ import annotations

import pytest
import torch

import harness
from harness.emulation import emulation_active


def _increment(numel: int, unroll: int = 4) -> int:
    """calc_execution_policy's offset increment on the current device."""
    properties = torch.cuda.get_device_properties(torch.cuda.current_device())
    blocks_per_sm = properties.max_threads_per_multi_processor // 256
    grid = min(properties.multi_processor_count * blocks_per_sm, (numel + 255) // 256)
    return ((numel - 1) // (256 * grid * unroll) + 1) * 4


def _seed_and_offset(state: torch.Tensor) -> tuple[int, int]:
    seed, offset = state.view(torch.int64).tolist()
    return seed % (1 << 64), offset


def test_the_state_is_the_seed_then_the_offset_in_16_bytes(cuda_kind):
    torch.cuda.manual_seed(123)
    state = torch.cuda.get_rng_state()
    assert state.dtype == torch.uint8 and state.numel() == 16
    assert _seed_and_offset(state) == (123, 0)
    torch.rand(10, device="cuda")
    assert _seed_and_offset(torch.cuda.get_rng_state()) == (123, 4)


def test_the_offset_moves_by_cudas_increment_for_each_draw(cuda_kind):
    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    torch.cuda.manual_seed(0)
    assert generator.get_offset() == 0
    expected = 0
    for draw, numel, unroll in [
            (lambda n: torch.rand(n, device="cuda"), 10, 4),
            (lambda n: torch.randn(n, device="cuda"), 4096, 4),
            # past 256 threads * the grid * 4 elements each: a thread draws twice
            (lambda n: torch.empty(n, device="cuda").uniform_(), 1_081_345 * 2, 4),
            # double draws two per curand call
            (lambda n: torch.empty(n, dtype=torch.float64, device="cuda").normal_(), 540_673 * 2, 2),
            (lambda n: torch.empty(0, device="cuda").normal_(), 0, 4)]:
        draw(numel)
        expected += _increment(numel, unroll) if numel else 0
        assert generator.get_offset() == expected, (numel, unroll)


def test_bernoulli_with_a_tensor_of_probabilities_moves_the_offset_by_12(cuda_kind):
    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    probabilities = torch.full((1000,), 0.5, device="cuda")
    torch.cuda.manual_seed(0)
    torch.bernoulli(probabilities)
    assert generator.get_offset() == 12


def test_the_offset_is_set_in_multiples_of_4(cuda_kind):
    generator = torch.Generator(device="cuda")
    generator.set_offset(8)
    assert generator.get_offset() == 8
    with pytest.raises(RuntimeError, match="offset must be a multiple of 4"):
        generator.set_offset(6)


def test_set_state_takes_cudas_layout_with_its_checks(cuda_kind):
    generator = torch.Generator(device="cuda")
    generator.set_state(torch.tensor([7, 64], dtype=torch.int64).view(torch.uint8))
    assert (generator.initial_seed(), generator.get_offset()) == (7, 64)
    generator.set_state(torch.tensor([9], dtype=torch.int64).view(torch.uint8))  # seed only
    assert (generator.initial_seed(), generator.get_offset()) == (9, 0)
    with pytest.raises(RuntimeError, match="RNG state is wrong size"):
        generator.set_state(torch.zeros(12, dtype=torch.uint8))
    with pytest.raises(TypeError, match="RNG state must be a torch.ByteTensor"):
        generator.set_state(torch.zeros(2, dtype=torch.int64))


def test_a_state_set_back_repeats_the_draw(cuda_kind):
    torch.cuda.manual_seed(5)
    torch.randn(7, device="cuda")
    state = torch.cuda.get_rng_state()
    first = torch.randn(7, device="cuda")
    torch.cuda.set_rng_state(state)
    assert torch.equal(torch.randn(7, device="cuda"), first)
    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    generator.set_offset(4)
    assert torch.equal(torch.randn(7, device="cuda"), first)


def test_cpu_draws_do_not_move_the_device_generator(cuda_kind):
    torch.cuda.manual_seed(11)
    expected = torch.rand(5, device="cuda")
    torch.cuda.manual_seed(11)
    torch.randn(3)  # a cpu draw between the seed and the device draw
    assert torch.equal(torch.rand(5, device="cuda"), expected)


def test_cuda_manual_seed_leaves_the_cpu_generator_and_manual_seed_seeds_both(cuda_kind):
    torch.manual_seed(1)
    expected = torch.rand(3)
    torch.manual_seed(1)
    torch.cuda.manual_seed(2)
    assert torch.equal(torch.rand(3), expected)
    assert torch.cuda.initial_seed() == 2 and torch.initial_seed() == 1
    torch.manual_seed(3)
    assert torch.cuda.initial_seed() == 3


def test_a_fresh_random_seed_has_53_bits(cuda_kind):
    torch.cuda.seed()
    assert 0 <= torch.cuda.initial_seed() < 1 << 53


def test_a_generator_of_the_device_has_a_state_of_its_own(cuda_kind):
    generator = torch.Generator(device="cuda")
    generator.manual_seed(4)
    torch.cuda.manual_seed(4)
    default = torch.cuda.default_generators[torch.cuda.current_device()]
    first = torch.rand(6, device="cuda", generator=generator)
    assert (generator.get_offset(), default.get_offset()) == (4, 0)
    assert torch.equal(torch.rand(6, device="cuda"), first)  # same seed and offset: same values
    assert _seed_and_offset(generator.get_state()) == (4, 4)


def test_fork_rng_restores_the_device_state(cuda_kind):
    torch.cuda.manual_seed(8)
    expected = torch.rand(4, device="cuda")
    torch.cuda.manual_seed(8)
    with torch.random.fork_rng(devices=[torch.cuda.current_device()], device_type="cuda"):
        torch.rand(100, device="cuda")
    assert torch.equal(torch.rand(4, device="cuda"), expected)


def test_replays_draw_at_the_offsets_eager_draws_would_use(cuda_kind):
    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    torch.cuda.manual_seed(21)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph.capture_begin()
        out = torch.rand(8, device="cuda") + torch.randn(8, device="cuda")
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    assert generator.get_offset() == 0  # capture draws nothing
    replays = []
    for _ in range(2):
        graph.replay()
        replays.append(out.clone())
    assert generator.get_offset() == 16
    torch.cuda.manual_seed(21)
    for replayed in replays:
        assert torch.equal(replayed, torch.rand(8, device="cuda") + torch.randn(8, device="cuda"))


def test_offset_calls_during_capture_raise_cudas_error(cuda_kind):
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer's capture is no CUDA capture: the real generator answers "
                    "get_offset() and seed() during it, and the capture refuses the state change "
                    "with its own CaptureError (docs/fidelity.md)")
    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    graph = torch.cuda.CUDAGraph()
    raised = []
    with torch.cuda.graph(graph):
        for call in (generator.get_offset, lambda: generator.set_offset(0), generator.seed):
            try:
                call()
            except RuntimeError as error:
                raised.append(str(error))
        torch.zeros(1, device="cuda").add_(1)
    assert len(raised) == 3
    assert all("during CUDA graph capture" in text for text in raised)
    assert "CUDAGeneratorImpl::get_offset" in raised[0]


def test_each_emulated_device_has_its_own_default_generator(outside_emulation):
    with harness.emulate_cuda(device="cpu", device_count=2):
        torch.manual_seed(3)
        with torch.cuda.device(1):
            torch.cuda.manual_seed(4)
            torch.rand(2, device="cuda")
        first, second = torch.cuda.default_generators
        assert (first.initial_seed(), first.get_offset()) == (3, 0)
        assert (second.initial_seed(), second.get_offset()) == (4, 4)
        assert [s.numel() for s in torch.cuda.get_rng_state_all()] == [16, 16]


def test_a_seed_given_before_entering_seeds_the_device(outside_emulation):
    torch.manual_seed(17)
    with harness.emulate_cuda(device="cpu"):
        assert torch.cuda.initial_seed() == 17


def test_device_draws_leave_the_cpu_generator_as_it_was(cuda_kind):
    if emulation_active() != "cpu":
        pytest.skip("the emulated device runs cpu kernels: natively nothing to check")
    before = torch.get_rng_state()
    torch.randn(64, device="cuda")
    torch.nn.functional.dropout(torch.ones(64, device="cuda"), 0.5)
    torch.empty(64, device="cuda").uniform_(generator=torch.Generator(device="cuda"))
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("n, moved", [(0, 0), (1081345, 1081360), (2162690, 2162712)])
def test_randperm_moves_the_offset_by_its_keys_and_its_shuffle(cuda_device, n, moved):
    """Measured on an H100 (132 SMs, the emulated device's default): random_ over int64 keys
    (12 and 20 at these sizes), then n rounded up to 4 for the shuffle of equal keys."""
    generator = torch.cuda.default_generators[0]
    before = generator.get_offset()
    torch.randperm(n, device="cuda")
    assert generator.get_offset() - before == moved
