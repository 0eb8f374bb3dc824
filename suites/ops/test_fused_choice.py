"""The one chooser behind decode_linear and rope_kv_write: on a CUDA device, with and without
triton (stood in for by the blocker the chooser asks), each option gets the same decision and a
message naming that option; an engine counts each option that fell back."""

from __future__ import annotations

import pytest

from fixtures.emulated_device import own_emulated_device
from harness.model import ReferenceLlama, tiny_llama
from harness.ops import fused_choice
from harness.ops.decode_linear_choice import DecodeLinearChoice, choose_decode_linear
from harness.ops.rope_kv_choice import RopeKvChoice, choose_rope_kv_write
from harness.runtime import Engine, EngineConfig

CHOOSERS = {"decode_linear": (choose_decode_linear, DecodeLinearChoice),
            "rope_kv_write": (choose_rope_kv_write, RopeKvChoice)}


def cuda_without_triton(device):
    return "triton is not importable (ImportError: planted)", True


def cuda_with_triton(device):
    return None, False


@pytest.mark.parametrize("option", list(CHOOSERS))
def test_an_explicit_fused_request_on_cuda_without_triton_is_refused(option, monkeypatch):
    choose, _ = CHOOSERS[option]
    monkeypatch.setattr(fused_choice, "triton_blocker", cuda_without_triton)
    with pytest.raises(ValueError, match=rf"{option}='fused' cannot run here: triton is not "
                                         rf"importable .*ask for {option}='separate'"):
        choose("fused", "cuda")


@pytest.mark.parametrize("option", list(CHOOSERS))
def test_auto_on_cuda_without_triton_falls_back_and_says_so(option, monkeypatch):
    choose, choice_type = CHOOSERS[option]
    monkeypatch.setattr(fused_choice, "triton_blocker", cuda_without_triton)
    auto = choose(None, "cuda")
    assert type(auto) is choice_type
    assert (auto.mode, auto.fell_back) == ("separate", True) and "planted" in auto.reason
    assert choose("separate", "cuda") == choice_type("separate", "separate", "requested")


@pytest.mark.parametrize("option", list(CHOOSERS))
def test_cuda_with_triton_takes_the_fused_path(option, monkeypatch):
    choose, choice_type = CHOOSERS[option]
    monkeypatch.setattr(fused_choice, "triton_blocker", cuda_with_triton)
    assert choose(None, "cuda") == choice_type(None, "fused", "CUDA device with triton")
    assert choose("fused", "cuda") == choice_type("fused", "fused", "requested")


def test_a_choice_of_one_option_is_not_equal_to_the_same_choice_of_the_other():
    assert DecodeLinearChoice(None, "fused", "x") != RopeKvChoice(None, "fused", "x")


def test_an_engine_counts_each_fallback_under_its_option(monkeypatch):
    """On a CUDA device without triton, each option the engine chose for the device and that fell
    back is counted once in `stats.fallbacks`, named with its reason."""
    monkeypatch.setattr(fused_choice, "triton_blocker", cuda_without_triton)
    with own_emulated_device():
        model = ReferenceLlama.from_hf(tiny_llama(seed=0)).to("cuda")
        engine = Engine(model, EngineConfig(max_batch_size=2, max_num_tokens=32, block_size=16,
                                            max_model_len=32))
    reason = "triton is not importable (ImportError: planted)"
    assert dict(engine.stats.fallbacks) == {f"rope + KV write separate: {reason}": 1,
                                            f"decode linear separate: {reason}": 1,
                                            f"greedy ranking separate: {reason}": 1}
