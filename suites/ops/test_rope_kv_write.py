"""harness::rope_kv_write without triton: its torch implementation (CPU and the emulated device,
graphs included) against the unfused path and float64, its trace by dynamo and inductor, the
attention ops finding the cache written, and how an engine chooses it (EngineConfig.rope_kv_write)."""

from __future__ import annotations


import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.ops import AttentionMetadata, SequenceSpan, paged_attention
from harness.ops.rope_kv_choice import choose_rope_kv_write
from harness.ops.rope_kv_write import rope_kv_write, rope_kv_write_op
from harness.ops.rotary import apply_rotary_
from harness.records import Request
from harness.runtime import Engine, EngineConfig
from suites.ops.rope_kv_cases import (bf16_steps, float64_rotation, replay_on_a_later_case, rope_kv_case,
                                      separate_path)
from suites.ops.test_decode_attention import OpNames
from fixtures.emulated_device import on_the_emulated_device


@pytest.mark.parametrize("shape", [dict(), dict(heads=32, kv_heads=8, head_dim=64, block_size=16),
                                   dict(heads=3, kv_heads=1, head_dim=12, block_size=3, pad_rows=2)])
def test_torch_path_is_the_separate_path_bit_for_bit(shape) -> None:
    case = rope_kv_case(**shape)
    k, v = case.k.clone(), case.v.clone()
    expected_q, expected_layer = separate_path(case)
    rope_kv_write(*case.args())
    assert torch.equal(case.q, expected_q), "q is not rotated as the separate path rotates it"
    assert torch.equal(case.cache.layer(0), expected_layer), "the cache differs from the separate path's"
    # Declared in the schema: only q and the cache are written.
    assert torch.equal(case.k, k) and torch.equal(case.v, v), "k or v changed (not in mutates_args)"


def test_torch_path_is_within_a_step_of_float64() -> None:
    case = rope_kv_case(heads=8, kv_heads=2, head_dim=32, tokens=7, pad_rows=0)
    q0, k0, v0 = case.q.clone(), case.k.clone(), case.v.clone()
    rope_kv_write(*case.args())
    q_ref = float64_rotation(q0, case.cos, case.sin)
    k_ref = float64_rotation(k0, case.cos, case.sin)
    flat = case.cache.layer(0).flatten(1, 2)[:, case.slot_mapping].double()
    for name, got, want in (("q", case.q.double(), q_ref), ("k", flat[0], k_ref)):
        limit = bf16_steps(torch.bfloat16, want.abs().max().item(), 2)
        assert (got - want).abs().max().item() <= limit, f"{name} off float64 rope by more than 2 steps"
    assert torch.equal(flat[1], v0.double()), "v was not stored as it came"


def test_padded_rows_write_only_the_pad_sink() -> None:
    case = rope_kv_case(tokens=3, pad_rows=3)
    before = case.cache.layer(0).clone()
    rope_kv_write(*case.args())
    touched = (case.cache.layer(0) != before).flatten(1, 2).any(0).any(-1).any(-1)
    allowed = torch.zeros_like(touched)
    allowed[case.slot_mapping] = True
    assert not (touched & ~allowed).any(), "a slot outside the slot mapping was written"


def test_the_wrapper_refuses_mismatched_shapes() -> None:
    case = rope_kv_case()
    q, k, v, cos, sin, layer, slots = case.args()
    with pytest.raises(ValueError, match=r"cos .* must be \[6, 1, 16\]"):
        rope_kv_write(q, k, v, cos[:-1], sin, layer, slots)
    with pytest.raises(ValueError, match="slot_mapping"):
        rope_kv_write(q, k, v, cos, sin, layer, slots[:-1])


def test_dynamo_and_inductor_trace_the_op() -> None:
    """A registered custom op with a fake: traced whole (fullgraph), compiled by inductor, and the
    mutation of q and the cache reaches the caller's tensors."""
    case, twin = rope_kv_case(seed=1), rope_kv_case(seed=1)

    def step(q, k, v, cos, sin, layer, slots):
        rope_kv_write_op(q, k, v, cos, sin, layer, slots)
        return q.sum(dtype=torch.float32)

    compiled = torch.compile(step, backend="inductor", fullgraph=True, dynamic=False)
    got = compiled(*case.args())
    expected = step(*twin.args())
    assert torch.equal(got, expected)
    assert torch.equal(case.q, twin.q) and torch.equal(case.cache.tensor, twin.cache.tensor)


def test_the_emulated_device_captures_and_replays_the_op() -> None:
    """Capture on one batch, copy another's values into the captured inputs, replay: q and the
    cache as the eager op makes them of the second batch."""
    with on_the_emulated_device():
        first, later = rope_kv_case(device="cuda", seed=2), rope_kv_case(device="cuda", seed=5)
        expected_q, expected_layer = separate_path(later)
        replay_on_a_later_case(first, later)
        assert torch.equal(first.q.cpu(), expected_q.cpu())
        assert torch.equal(first.cache.layer(0).cpu(), expected_layer.cpu())


def test_attention_with_the_cache_written_matches_attention_writing_it() -> None:
    """k = v = None: the attention op reads what rope_kv_write stored, and its output is the
    separate path's (rope, then the op writing k/v itself)."""
    case = rope_kv_case(tokens=2, pad_rows=0, block_size=4, num_blocks=6)
    spans = [SequenceSpan(3, 1, [0]), SequenceSpan(5, 1, [1, 2])]
    md = AttentionMetadata(2, 2, 2, 4, case.cache.pad_slot)
    md.prepare(spans, num_tokens=2, num_seqs=2)
    case.slot_mapping.copy_(md.slot_mapping[:2])
    separate = rope_kv_case(tokens=2, pad_rows=0, block_size=4, num_blocks=6)
    separate.slot_mapping.copy_(md.slot_mapping[:2])
    qkv = separate.qkv.clone()
    apply_rotary_(qkv[:, : case.heads + case.kv_heads], case.cos, case.sin)
    expected = torch.empty_like(case.q)
    paged_attention(qkv[:, :4], qkv[:, 4:6], qkv[:, 6:], separate.cache.layer(0), md, 0.25, expected)
    rope_kv_write(*case.args())
    out = torch.empty_like(case.q)
    paged_attention(case.q, None, None, case.cache.layer(0), md, 0.25, out)
    assert torch.equal(out, expected)
    with pytest.raises(ValueError, match="k and v must be given together"):
        paged_attention(case.q, case.k, None, case.cache.layer(0), md, 0.25, out)


def test_auto_chooses_separate_off_cuda_and_fused_is_kept_there() -> None:
    auto = choose_rope_kv_write(None, "cpu")
    assert (auto.mode, auto.fell_back) == ("separate", False) and "cpu" in auto.reason
    assert choose_rope_kv_write("fused", "cpu").mode == "fused"
    assert choose_rope_kv_write("separate", "cpu").mode == "separate"


def test_auto_on_the_emulated_device_is_separate_and_fused_runs_the_torch_ops() -> None:
    with on_the_emulated_device():
        auto = choose_rope_kv_write(None, "cuda")
        assert auto.mode == "separate" and "emulated CUDA device" in auto.reason
        assert choose_rope_kv_write("fused", "cuda").mode == "fused"


def test_unknown_modes_are_refused() -> None:
    with pytest.raises(ValueError, match=r"rope_kv_write must be one of \['separate', 'fused'\]"):
        choose_rope_kv_write("triton", "cpu")
    with pytest.raises(ValueError, match="EngineConfig.rope_kv_write"):
        EngineConfig(rope_kv_write="both")
    with pytest.raises(ValueError, match="rope_kv_write must be one of"):
        AttentionMetadata(1, 1, 1, 1, 1, rope_kv_write="yes")


def test_the_mode_round_trips_through_a_reproduction_file() -> None:
    config = EngineConfig(rope_kv_write="fused")
    assert EngineConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize("mode", ["fused", "separate"])
def test_the_engine_reports_its_choice_and_the_model_follows_it(reference_llama, mode) -> None:
    engine = Engine(reference_llama, EngineConfig(max_batch_size=2, max_num_tokens=32, max_model_len=64,
                                                  rope_kv_write=mode))
    assert engine.rope_kv_write.mode == engine.metadata.rope_kv_write == mode
    with OpNames() as seen:
        engine.generate([Request([3, 4, 5], 2)])
    assert ("harness.rope_kv_write.default" in seen.names) == (mode == "fused")


class TopLevelOps(TorchDispatchMode):
    """Every op dispatched at the top level but views (an op's own inner ops are not seen: the mode
    is off while it handles one), as a graph recording at the dispatcher records them."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += not func.is_view
        return func(*args, **(kwargs or {}))


def test_the_fused_mode_dispatches_two_ops_fewer_per_layer(reference_llama) -> None:
    """Separate: roll, mul_ and addcmul_ of RoPE per layer (the write is inside the attention op);
    fused: the one op. Same batch, same model, one forward each."""
    counts = {}
    for mode in ("separate", "fused"):
        engine = Engine(reference_llama, EngineConfig(max_batch_size=2, max_num_tokens=32,
                                                      max_model_len=64, rope_kv_write=mode))
        engine.metadata.prepare([SequenceSpan(3, 3, engine.kv_cache.allocator.allocate(1))])
        ids = torch.tensor([3, 4, 5])
        reference_llama(ids, engine.metadata, engine.kv_cache)  # the workspace grows once, here
        with TopLevelOps() as seen:
            reference_llama(ids, engine.metadata, engine.kv_cache)
        counts[mode] = seen.count
    assert counts["separate"] - counts["fused"] == 2 * reference_llama.num_layers, counts
