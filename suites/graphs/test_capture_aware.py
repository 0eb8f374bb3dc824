"""Code that asks whether it is being captured: transformers' `is_tracing()` (and vLLM, FlashInfer)
skip host-side checks while `torch.cuda.is_current_stream_capturing()` is true. During an emulated
capture it answers true, on every device, as it does under a CUDA capture; and false after."""

from __future__ import annotations

import torch

from suites.graphs._decoders import captured_and_eager, decode_step, tiny_causal_lm


def _asks() -> bool:
    try:
        return torch.cuda.is_current_stream_capturing()
    except RuntimeError:  # torch built without CUDA has no capture to ask about
        return False


def test_is_current_stream_capturing_answers_true_during_capture_only(backend):
    x = torch.ones(3, device=backend.device)
    seen = {}

    def fn():
        seen["during"] = _asks()
        return x + 1 if seen["during"] else x - 1

    assert not _asks()
    graph = backend.capture(fn)
    assert seen["during"] and not _asks()
    graph.replay()
    backend.synchronize()
    assert torch.equal(graph.output, torch.full((3,), 2.0, device=backend.device))


def test_transformers_is_tracing_follows_the_capture(backend):
    from transformers.utils.import_utils import is_tracing

    x = torch.ones(3, device=backend.device)
    seen = {}

    def fn():
        seen["during"] = is_tracing(x)
        return x * 2

    backend.capture(fn)
    assert seen["during"] and not is_tracing(x)


def test_gpt2_decode_step_without_attention_mask_skips_the_padding_check(backend):
    # Without an attention mask and with a pad token, GPT-2 checks the input ids for padding (a
    # host read), unless is_tracing() says a capture is in progress.
    model = tiny_causal_lm("gpt2", backend.device)
    replayed, eager = captured_and_eager(backend, lambda: decode_step(model))
    torch.testing.assert_close(replayed, eager)
