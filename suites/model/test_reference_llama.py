"""ReferenceLlama agrees with transformers' Llama within 2 BF16 steps of logit.

How the transformers reference is run: for every sequence in a batch, transformers' own forward runs
alone on the sequence's full token prefix (prompt plus any tokens decoded so far, batch 1, no cache, no
padding, its default attention), and the logits of the last position are taken. ReferenceLlama runs
the same sequences batched and paged: a prefill step writes the prompts' K/V into the paged cache,
decode steps read them back, mixed steps do both. Its logits for each sequence's last token must be
within 2 BF16 steps, where a step is the bf16 spacing at that row's logit scale (max |logit| of the
transformers row), of every entry of transformers' row.
"""

from __future__ import annotations

import random

import pytest
import torch

from harness.check import bf16_step
from harness.model import ReferenceLlama, tiny_llama
from harness.ops import AttentionMetadata, PagedKVCache, SequenceSpan

STEPS = 2


class PagedDriver:
    """Runs a ReferenceLlama over named sequences step by step: an engine without sampling."""

    def __init__(self, model: ReferenceLlama, *, block_size=16, num_blocks=48, max_batch_size=8,
                 max_num_tokens=256, max_model_len=128) -> None:
        self.model = model
        self.cache = PagedKVCache(model.num_layers, num_blocks, block_size, model.num_kv_heads, model.head_dim,
                                  model.dtype, model.device)
        self.metadata = AttentionMetadata(max_batch_size, max_num_tokens, -(-max_model_len // block_size),
                                          block_size, self.cache.pad_slot, model.device)
        self.tokens: dict[str, list[int]] = {}
        self.cached: dict[str, int] = {}
        self.blocks: dict[str, list[int]] = {}

    def step(self, new_tokens: dict[str, list[int]], *, num_tokens=None, num_seqs=None) -> dict[str, torch.Tensor]:
        """Append `new_tokens` to each named sequence, run one forward, return each one's last logits."""
        for name, tokens in new_tokens.items():
            self.tokens.setdefault(name, [])
            self.cached.setdefault(name, 0)
            self.tokens[name] += tokens
            needed = self.cache.blocks_for(len(self.tokens[name])) - len(self.blocks.setdefault(name, []))
            self.blocks[name] += self.cache.allocator.allocate(needed)
        # Prefills (several new tokens, or a one-token prompt) must come before decodes.
        order = sorted(new_tokens, key=lambda n: self.cached[n] > 0 and len(new_tokens[n]) == 1)
        spans = [SequenceSpan(len(self.tokens[n]), len(self.tokens[n]) - self.cached[n], self.blocks[n])
                 for n in order]
        self.metadata.prepare(spans, num_tokens=num_tokens, num_seqs=num_seqs)
        ids = [t for n in order for t in self.tokens[n][self.cached[n]:]]
        ids += [0] * (self.metadata.num_tokens - len(ids))
        logits = self.model(torch.tensor(ids, device=self.model.device), self.metadata, self.cache)
        for n in order:
            self.cached[n] = len(self.tokens[n])
        self.last_logits = logits
        return {n: logits[i] for i, n in enumerate(order)}


@torch.no_grad()
def hf_last_logits(hf_model, tokens: list[int]) -> torch.Tensor:
    ids = torch.tensor([tokens], device=hf_model.lm_head.weight.device)
    return hf_model(ids).logits[0, -1].float()


def worst_steps(driver: PagedDriver, hf_model, logits: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per sequence: max |ours - transformers| over the vocabulary, in BF16 steps at the row's scale."""
    result = {}
    for name, ours in logits.items():
        theirs = hf_last_logits(hf_model, driver.tokens[name])
        result[name] = (ours.float() - theirs).abs().max().item() / bf16_step(theirs.abs().max().item())
    return result


def prompts(lengths, seed=0, vocab=512):
    rng = random.Random(seed)
    return {f"s{i}": [rng.randrange(vocab) for _ in range(n)] for i, n in enumerate(lengths)}


def assert_within(worst: dict[str, float]) -> None:
    bad = {n: w for n, w in worst.items() if w > STEPS}
    assert not bad, f"sequences beyond {STEPS} BF16 steps of transformers: {bad}"


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def models(request, tiny_hf_model, reference_llama):
    """(transformers model, ReferenceLlama) on each device: the agreement must hold on CPU and GPU."""
    if request.param == "cpu":
        return tiny_hf_model, reference_llama
    hf = tiny_llama(seed=0, device="cuda")
    return hf, ReferenceLlama.from_hf(hf)


def test_prefill_only(models):
    tiny_hf_model, reference_llama = models
    driver = PagedDriver(reference_llama)
    # 1 token, inside one block, exactly one block, across block boundaries
    logits = driver.step(prompts([1, 5, 16, 17, 33, 40]))
    assert driver.metadata.num_decodes == 0
    assert_within(worst_steps(driver, tiny_hf_model, logits))


def test_decode_only(models):
    tiny_hf_model, reference_llama = models
    driver = PagedDriver(reference_llama)
    batch = prompts([2, 9, 15, 31], seed=1)
    driver.step(batch)
    rng = random.Random(5)
    for _ in range(3):  # the third decode of the 15-token prompt crosses into its second block
        logits = driver.step({name: [rng.randrange(512)] for name in batch})
        assert driver.metadata.num_prefills == 0 and driver.metadata.num_decodes == len(batch)
        assert_within(worst_steps(driver, tiny_hf_model, logits))


def mixed_step(driver: PagedDriver) -> dict[str, torch.Tensor]:
    """Prefill two prompts, then one step that prefills three more and decodes the first two."""
    driver.step(prompts([6, 20], seed=2))
    fresh = {f"new{i}": p for i, p in enumerate(prompts([1, 13, 27], seed=3).values())}
    logits = driver.step({**fresh, "s0": [11], "s1": [300]})
    assert (driver.metadata.num_prefills, driver.metadata.num_decodes) == (3, 2)
    return logits


def test_mixed_prefill_and_decode(models):
    tiny_hf_model, reference_llama = models
    driver = PagedDriver(reference_llama)
    logits = mixed_step(driver)
    assert driver.last_logits.device == reference_llama.device
    assert_within(worst_steps(driver, tiny_hf_model, logits))


@pytest.mark.parametrize("overrides", [
    {"tie_word_embeddings": True},
    {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}},
    {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
    {"num_key_value_heads": 4},
    {"num_key_value_heads": 1, "num_hidden_layers": 3},
], ids=["tied", "rope_theta_500", "llama3_rope", "mha", "mqa_3_layers"])
def test_config_variants(overrides):
    """Config is read, not assumed: tied lm_head, RoPE theta and scaling, head grouping, depth."""
    hf = tiny_llama(seed=7, **overrides)
    driver = PagedDriver(ReferenceLlama.from_hf(hf))
    driver.step(prompts([4, 30], seed=4))
    logits = driver.step({**prompts([9], seed=5), "s0": [1], "s1": [2]})
    assert_within(worst_steps(driver, hf, logits))


def test_check_fails_on_wrong_rope_theta(tiny_hf_model):
    """Planted bug: RoPE theta assumed (10000) instead of read from the config (500)."""
    hf = tiny_llama(seed=0, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    driver = PagedDriver(ReferenceLlama.from_hf(tiny_hf_model))  # same weights, theta 10000
    logits = driver.step(prompts([24, 40], seed=6))
    assert min(worst_steps(driver, hf, logits).values()) > STEPS


def test_check_fails_on_lost_kv(tiny_hf_model, reference_llama):
    """Planted bug: the cache loses the prompt's K/V between prefill and decode."""
    driver = PagedDriver(reference_llama)
    driver.step(prompts([12, 30], seed=8))
    driver.cache.tensor.zero_()
    logits = driver.step({"s0": [5], "s1": [6]})
    assert min(worst_steps(driver, tiny_hf_model, logits).values()) > STEPS


def test_padding_changes_no_real_row(reference_llama):
    """A batch padded with dummy token rows and sequences (as a graph replays it) yields the same
    logits for the real sequences; the output has one row per padded sequence, in float32."""
    batch = prompts([3, 8, 21], seed=9)
    plain, padded = PagedDriver(reference_llama), PagedDriver(reference_llama)
    plain.step(batch)
    padded.step(batch, num_tokens=48, num_seqs=6)
    assert padded.last_logits.shape == (6, 512) and padded.last_logits.dtype == torch.float32
    assert torch.equal(padded.last_logits[:3], plain.last_logits)
    decode = {name: [7] for name in batch}
    assert torch.equal(torch.stack(list(padded.step(decode, num_tokens=5, num_seqs=5).values())),
                       torch.stack(list(plain.step(decode).values())))


def test_too_few_input_ids_is_an_error(reference_llama):
    driver = PagedDriver(reference_llama)
    driver.metadata.prepare([SequenceSpan(4, 4, driver.cache.allocator.allocate(1))])
    with pytest.raises(ValueError, match="input_ids holds 3 tokens, the metadata describes 4"):
        reference_llama(torch.zeros(3, dtype=torch.int64), driver.metadata, driver.cache)


def test_from_hf_rejects_foreign_weights(tiny_hf_model):
    class NotLlama(torch.nn.Module):
        config = tiny_hf_model.config
        lm_head = tiny_hf_model.lm_head

        def state_dict(self):
            return {"lm_head.weight": tiny_hf_model.lm_head.weight, "something.else": torch.zeros(1)}

    with pytest.raises(ValueError, match="missing .*embed_tokens.weight.*unexpected \\['something.else'\\]"):
        ReferenceLlama.from_hf(NotLlama())


def test_from_hf_leaves_the_global_rng_alone(tiny_hf_model):
    torch.manual_seed(99)
    expected = torch.rand(3)
    torch.manual_seed(99)
    ReferenceLlama.from_hf(tiny_hf_model)
    assert torch.equal(torch.rand(3), expected)
