"""transformers' own generation paths on the device: `generate` with the static cache it compiles
(reduce-overhead: cudagraph trees), the documented `model.forward = torch.compile(...)` recipe,
caches with sliding layers, the offloaded cache (a side stream and pinned memory), assisted
generation and prompt lookup. Tiny models from transformers' config classes with seeded weights
(no network); each generate's greedy tokens are compared with the same model's eager tokens on the
CPU, outside the emulation. Rows that compile a model take 10-30 s on two cores: slow."""

from __future__ import annotations

import contextlib

import pytest
import torch

from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice
from harness.emulation.tracking import RaceError
from harness.graphs import FreedMemoryError
from suites.cuda_device._tiny_llama import prefetch_waits_for_the_offload

transformers = pytest.importorskip("transformers")

PROMPT = [[1, 5, 7, 9, 11, 13, 17, 19]]
NEW_TOKENS = 8
_COMMON = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, vocab_size=128, max_position_embeddings=64,
               pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _tiny(arch: str, seed: int = 0):
    """A tiny seeded model on the host; Mistral and Gemma 2 with a sliding window of 4, shorter
    than the prompt, so their sliding layers drop keys while generating."""
    if arch == "llama":
        config, cls = transformers.LlamaConfig(**_COMMON), transformers.LlamaForCausalLM
    elif arch == "mistral":
        config = transformers.MistralConfig(**_COMMON, sliding_window=4)
        cls = transformers.MistralForCausalLM
    else:
        config = transformers.Gemma2Config(**_COMMON, sliding_window=4)
        cls = transformers.Gemma2ForCausalLM
    torch.manual_seed(seed)
    return cls(config).eval()


def _cpu_tokens(model, **generate) -> torch.Tensor:
    """The model's greedy tokens on the CPU, eager (`disable_compile`: transformers compiles only
    on accelerators anyway)."""
    with torch.no_grad():
        return model.generate(torch.tensor(PROMPT), max_new_tokens=NEW_TOKENS, do_sample=False,
                              disable_compile=True, **generate)


def _device_tokens(model, **generate) -> torch.Tensor:
    with torch.no_grad():
        out = model.generate(torch.tensor(PROMPT, device="cuda"), max_new_tokens=NEW_TOKENS,
                             do_sample=False, **generate)
    assert out.device.type == "cuda"
    return out.cpu()


class _Replays:
    def __init__(self) -> None:
        self.count = 0

    def on_replay(self, graph, stream) -> None:
        self.count += 1


def _refused_in_the_sanitizer(cuda_kind):
    """The graph sanitizer refuses inductor's CUDA graphs by name (sanitizer.py)."""
    if cuda_kind != "sanitizer":
        return contextlib.nullcontext()
    return pytest.raises(UnsupportedOnEmulatedDevice, match="cudagraph trees")


# --- what the compiled decoding step is made of ---------------------------------------------------

def _rotary_like(x: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    # transformers' rotary embedding and static cache: a buffer moved to a tensor's own device, a
    # factory on it
    positions = torch.arange(x.shape[-1], device=x.device)
    return x * inv_freq.to(device=x.device, dtype=torch.float) + positions


def test_reduce_overhead_replays_a_graph_that_names_its_tensors_device(cuda_kind):
    """Inside a trace the device's tensors say "cpu": `inv_freq.to(x.device)` was taken for a copy
    to the host and the graph ran without CUDA graphs, fresh outputs at every call (before
    2026-12-06). CUDA replays it, handing back the same output each replay."""
    compiled = torch.compile(_rotary_like, mode="reduce-overhead")
    inv_freq = torch.rand(4, device="cuda")
    kept, values = [], []
    with _refused_in_the_sanitizer(cuda_kind):
        for step in range(4):  # warm-up, recording, two replays; each call a generation
            x = torch.full((2, 4), float(step), device="cuda")
            kept.append(compiled(x, inv_freq))
            values.append(kept[-1].clone())
            torch.testing.assert_close(values[-1], _rotary_like(x, inv_freq))
        assert kept[-1].is_cuda and kept[-1].data_ptr() == kept[-2].data_ptr()


@pytest.mark.parametrize("factory", [
    pytest.param(lambda: torch.arange(3, device="cuda"), id="arange"),
    pytest.param(lambda: torch.linspace(0, 2, 3, device="cuda"), id="linspace"),
])
def test_a_compiled_device_constructor_naming_cuda_is_device_memory(cuda_kind, factory):
    """torch 2.11's dynamo hands a mode only `ones`/`zeros`/`empty`/`full` of the factories:
    `torch.arange(n, device="cuda")` in a graph failed to trace with "Found no NVIDIA driver" on
    the CUDA wheel without a GPU (transformers' static cache makes its positions so)."""
    out = torch.compile(lambda x: x + factory())(torch.zeros(3, device="cuda"))
    assert out.is_cuda and out.cpu().tolist() == [0.0, 1.0, 2.0]


# --- generate with the caches transformers compiles ----------------------------------------------

@pytest.mark.slow
def test_static_cache_generate_replays_each_decoding_step(cuda_device):
    """transformers compiles the decoding forward of a static-cache generate on "cuda" itself
    (`CompileConfig`: inductor, reduce-overhead). Its tokens are the CPU's, and the decoding steps
    after the warm-up and the recording are replays of one CUDA graph: none was, before
    2026-12-06 (the rotary embedding's `inv_freq.to(x.device)` read as a copy to the host)."""
    model = _tiny("llama")
    expected = _cpu_tokens(model, cache_implementation="static")
    replays = _Replays()
    with cuda_device.observe(replays):
        out = _device_tokens(model.to("cuda"), cache_implementation="static")
    assert torch.equal(out, expected)
    # 7 decoding steps: a warm-up, a recording (and its replay), five replays
    assert replays.count == NEW_TOKENS - 2


@pytest.mark.slow
def test_static_cache_generate_records_again_for_rebound_weights(cuda_device):
    """Weights rebound after a compiled generate (`param.data = new`, as a weight sync may do):
    the recording read the old parameter by address, so cudagraph trees record again for the new
    one. The tokens are the new weights' on the CPU: the rebinding is no bug here."""
    model = _tiny("llama")
    with torch.no_grad():
        model.to("cuda")
        _device_tokens(model, cache_implementation="static")
        model.lm_head.weight.data = model.lm_head.weight.data.flip(0)
        out = _device_tokens(model, cache_implementation="static")
        model.to("cpu")
    assert torch.equal(out, _cpu_tokens(model, cache_implementation="static"))


@pytest.mark.slow
def test_the_documented_compiled_forward_recipe_generates_the_cpus_tokens(cuda_device):
    """transformers' documented recipe: `model.forward = torch.compile(model.forward,
    mode="reduce-overhead", fullgraph=True)` and a static-cache generate, twice (a new cache the
    second time). The prefill is compiled too, so the cache is made inside a trace and never
    marked static: the decoding graph writes a plain input, and cudagraph trees skip it."""
    model = _tiny("llama")
    expected = _cpu_tokens(model, cache_implementation="static")
    model.to("cuda")
    model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    for _ in range(2):
        assert torch.equal(_device_tokens(model, cache_implementation="static"), expected)


@pytest.mark.slow
@pytest.mark.parametrize("arch, cache", [("gemma2", "static"), ("mistral", "sliding_window")])
def test_compiled_caches_with_sliding_layers_generate_the_cpus_tokens(cuda_device, arch, cache):
    model = _tiny(arch)
    expected = _cpu_tokens(model, cache_implementation=cache)
    assert torch.equal(_device_tokens(model.to("cuda"), cache_implementation=cache), expected)


# --- caches and decoding strategies that run eagerly -----------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_the_offloaded_cache_generates_the_dynamic_caches_tokens(cuda_device, arch):
    """The offloaded cache keeps each layer in pinned host memory and prefetches the next on a
    side stream; under strict race tracking its tokens are those of the dynamic cache on the CPU
    (Gemma 2: sliding layers beside full ones)."""
    model = _tiny(arch)
    expected = _cpu_tokens(model, cache_implementation="dynamic")
    model.to("cuda")
    if not prefetch_waits_for_the_offload():
        # transformers 5.17 (the H100 host's): its prefetch reads the pinned copy its offload is
        # still writing, a race of its own that the tracking reports with both lines
        with pytest.raises(RaceError, match=r"(?s)cache_utils\.py.*non_blocking=True"):
            _device_tokens(model, cache_implementation="offloaded")
        return
    assert torch.equal(_device_tokens(model, cache_implementation="offloaded"), expected)


@pytest.mark.parametrize("decoding", [
    pytest.param("assistant", id="assisted"),
    pytest.param("prompt_lookup", id="prompt-lookup"),
])
def test_speculative_decoding_generates_the_greedy_tokens(cuda_device, decoding):
    """Greedy assisted generation (a smaller draft model) and prompt lookup verify their drafts
    with the model: their tokens are the model's plain greedy tokens on the CPU."""
    model = _tiny("llama")
    expected = _cpu_tokens(model)
    if decoding == "assistant":
        options = {"assistant_model": _tiny("llama", seed=1).to("cuda")}
    else:
        options = {"prompt_lookup_num_tokens": 3}
    assert torch.equal(_device_tokens(model.to("cuda"), **options), expected)


# --- a captured decoding step and its weights ------------------------------------------------------

class _CapturedStep:
    """A decoding step of `model` (on the device, after a prompt in a static cache) captured by
    hand, as runtimes capture theirs. transformers' static cache counts its own length, so each
    run of the step writes the next position: every run here starts from the prompt again (the
    cache reset in place, its addresses kept, and the prompt run eagerly)."""

    def __init__(self, model) -> None:
        self.model = model
        self.cache = transformers.StaticCache(config=model.config, max_cache_len=32)
        self.prompt = torch.tensor(PROMPT, device="cuda")
        self.token = model(self.prompt, past_key_values=self.cache).logits[:, -1:].argmax(-1)
        self.position = torch.tensor([self.prompt.shape[1]], device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._step()  # warm up off the capture
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        self._restart()
        with torch.cuda.graph(self.graph):
            self.logits = self._step()

    def _step(self) -> torch.Tensor:
        return self.model(self.token, past_key_values=self.cache, cache_position=self.position,
                          position_ids=self.position[None]).logits

    def _restart(self) -> None:
        self.cache.reset()
        self.model(self.prompt, past_key_values=self.cache)

    def replayed(self) -> torch.Tensor:
        self._restart()
        self.graph.replay()
        return self.logits.clone()

    def eager(self) -> torch.Tensor:
        self._restart()
        return self._step().clone()


def test_a_captured_step_reads_weights_copied_in_place(cuda_kind):
    """Weights swapped by `copy_` into the parameters: the replay reads the new weights."""
    model = _tiny("llama").to("cuda")
    with torch.no_grad():
        step = _CapturedStep(model)
        before = step.replayed()
        torch.testing.assert_close(before, step.eager())
        model.lm_head.weight.copy_(model.lm_head.weight.flip(0))  # new weights, same memory
        after = step.replayed()
        torch.testing.assert_close(after, before.flip(-1))  # the vocabulary's rows reversed
        torch.testing.assert_close(after, step.eager())


def test_a_captured_step_whose_weights_were_rebound_is_refused_at_replay(cuda_device):
    """The planted bug: weights swapped by rebinding `.data` after the capture. The graph keeps
    the old weight's address, whose memory the caching allocator may hand out again: on CUDA a
    replay reads whatever lives there, silently. The emulated device refuses the replay, naming
    the capture's use and the line that dropped the buffer."""
    model = _tiny("llama").to("cuda")
    with torch.no_grad():
        step = _CapturedStep(model)
        model.lm_head.weight.data = model.lm_head.weight.data.flip(0)
        with pytest.raises(FreedMemoryError, match=r"(?s)lm_head.*weight\.data = "):
            step.replayed()
