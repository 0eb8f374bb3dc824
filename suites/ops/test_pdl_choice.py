"""EngineConfig.pdl without a GPU: validation, refusal where PDL cannot run, the fallback count,
the flag reaching every op through the metadata (eager and compiled), and numerics unchanged off
CUDA, where the ops' torch implementations ignore it."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.ops import pdl_choice
from harness.ops.pdl_choice import choose_pdl
from harness.ops.pdl_support import pdl_launch_options
from harness.runtime import Engine, EngineConfig
from harness.runtime.compiled.piece import PDL_OPTION, inductor_has_pdl, inductor_options
from harness.runtime.compiled.step import CompiledStep
from suites.compiled.test_compiled_decode_kernel import decode_batch, decode_metadata

PDL_OPS = ("harness.norm_gemv", "harness.gemv_residual", "harness.norm_gemv_silu_mul",
           "harness.rope_kv_write", "harness.paged_decode_attention")
FUSED = dict(decode_kernel="triton", rope_kv_write="fused", decode_linear="fused")


class PdlArguments(TorchDispatchMode):
    """(op name, its pdl argument) for every harness op that takes one, as dispatched."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func).removesuffix(".default")
        if name in PDL_OPS:
            # The dispatcher drops trailing arguments left at their default: pdl=False among them.
            index = [a.name for a in func._schema.arguments].index("pdl")
            value = args[index] if index < len(args) else (kwargs or {}).get("pdl", False)
            self.seen.append((name, value))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("bad", ["on", 1, 0.0])
def test_engine_config_refuses_a_pdl_that_is_not_a_bool(bad) -> None:
    with pytest.raises(ValueError, match=r"EngineConfig.pdl must be True, False or None"):
        EngineConfig(pdl=bad)


def test_true_on_the_cpu_is_refused_naming_the_device(reference_llama) -> None:
    with pytest.raises(ValueError, match=r"pdl=True cannot run here: .*device is cpu"):
        Engine(reference_llama, EngineConfig(max_batch_size=2, max_num_tokens=16, pdl=True))


def test_none_on_the_cpu_is_off_and_no_fallback(reference_llama) -> None:
    engine = Engine(reference_llama, EngineConfig(max_batch_size=2, max_num_tokens=16))
    assert engine.pdl.enabled is False and not engine.pdl.fell_back
    assert engine.metadata.pdl is False
    assert not any("PDL" in reason for reason in engine.stats.fallbacks)


def hopper_without_pdl_triton(monkeypatch, missing: str | None) -> None:
    """choose_pdl's view of a real CUDA device of capability 9.0 whose triton lacks `missing`."""
    monkeypatch.setattr(pdl_choice, "triton_blocker", lambda device: (None, False))
    monkeypatch.setattr(pdl_choice, "_capability", lambda device: (9, 0))
    import harness.ops.pdl_support as options
    monkeypatch.setattr(options, "pdl_missing", lambda: missing)


def test_a_hopper_whose_triton_lacks_pdl_falls_back_from_none_and_refuses_true(monkeypatch) -> None:
    hopper_without_pdl_triton(monkeypatch, "triton 3.1 has no triton.language.extra.cuda.gdc_wait")
    choice = choose_pdl(None, "cuda")
    assert not choice.enabled and choice.fell_back and "gdc_wait" in choice.reason
    with pytest.raises(ValueError, match=r"pdl=True cannot run here: triton 3.1 has no"):
        choose_pdl(True, "cuda")
    assert choose_pdl(False, "cuda") == pdl_choice.PdlChoice(False, False, "requested")


def test_a_hopper_with_pdl_triton_turns_it_on(monkeypatch) -> None:
    hopper_without_pdl_triton(monkeypatch, None)
    assert choose_pdl(None, "cuda").enabled and choose_pdl(True, "cuda").enabled


def test_an_older_gpu_is_off_without_a_fallback(monkeypatch) -> None:
    monkeypatch.setattr(pdl_choice, "triton_blocker", lambda device: (None, False))
    monkeypatch.setattr(pdl_choice, "_capability", lambda device: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    choice = choose_pdl(None, "cuda")
    assert not choice.enabled and not choice.fell_back and "8.0" in choice.reason
    with pytest.raises(ValueError, match=r"A100 has compute capability 8.0; PDL needs 9.0"):
        choose_pdl(True, "cuda")


def test_a_launch_asked_for_without_pdl_triton_is_refused(monkeypatch) -> None:
    import harness.ops.pdl_support as options

    monkeypatch.setattr(options, "pdl_missing", lambda: "triton 3.1 has no gdc_wait")
    assert pdl_launch_options(False) == {}
    with pytest.raises(ValueError, match=r"a PDL launch was asked for, but triton 3.1 has no"):
        pdl_launch_options(True)


@pytest.mark.parametrize("pdl", [False, True])
def test_the_flag_reaches_every_op_and_changes_no_value_off_cuda(reference_llama, pdl) -> None:
    model = reference_llama
    cache, spans, ids = decode_batch(model, "cpu")
    before = cache.tensor.clone()
    baseline = model(ids, decode_metadata(cache, spans, **FUSED), cache)
    cache.tensor.copy_(before)
    with PdlArguments() as mode:
        logits = model(ids, decode_metadata(cache, spans, pdl=pdl, **FUSED), cache)
    assert torch.equal(logits, baseline)
    layers = model.num_layers
    names = [name for name, _ in mode.seen]
    assert len(names) == 6 * layers  # qkv, rope + KV, attention, o_proj, gate_up, down
    assert {value for _, value in mode.seen} == {pdl}


def test_the_compiled_step_takes_pdl_from_its_engine_and_refuses_another(reference_llama) -> None:
    model = reference_llama
    cache, spans, ids = decode_batch(model, "cpu")
    step = CompiledStep(model, None, pdl=True, **FUSED)
    with pytest.raises(ValueError, match=r"built for pdl=True, the metadata asks for pdl=False"):
        step(ids, decode_metadata(cache, spans, **FUSED), cache)
    assert step.backend.pdl is True


def test_inductor_options_ask_for_pdl_only_with_it() -> None:
    assert inductor_options() == {}
    assert inductor_options(pdl=False) == {}
    assert inductor_options(pdl=True) == ({PDL_OPTION: True} if inductor_has_pdl() else {})
