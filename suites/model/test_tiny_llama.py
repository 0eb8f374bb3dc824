"""The seeded tiny Llama: reproducible, leaves the global RNG alone, and has logits that decide."""

import torch

from harness.check import bf16_step
from harness.model import llama_1b_config, tiny_llama
from harness.model.rope import rope_parameters


def test_same_seed_same_weights_other_seed_other_weights():
    a, b, c = tiny_llama(seed=3), tiny_llama(seed=3), tiny_llama(seed=4)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["lm_head.weight"], sc["lm_head.weight"])


def test_global_rng_untouched():
    torch.manual_seed(1234)
    expected = torch.rand(4)
    torch.manual_seed(1234)
    tiny_llama(seed=0)
    assert torch.equal(torch.rand(4), expected)


def test_shape_and_dtype(tiny_hf_model):
    config = tiny_hf_model.config
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
            config.num_key_value_heads, config.head_dim, config.vocab_size) == (2, 64, 4, 2, 16, 512)
    assert tiny_hf_model.lm_head.weight.dtype == torch.bfloat16
    assert tiny_llama(seed=0, dtype=torch.float32).lm_head.weight.dtype == torch.float32


def test_tied_variant_shares_embedding():
    model = tiny_llama(seed=0, tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight


@torch.no_grad()
def test_logits_are_decisive(tiny_hf_model):
    """max |logit| is O(5-20) and the top two logits are usually far more than 2 BF16 steps apart."""
    prompts = torch.randint(0, 512, (4, 32), generator=torch.Generator().manual_seed(0))
    logits = tiny_hf_model(prompts).logits.float().reshape(-1, 512)
    scales = logits.abs().amax(dim=-1)
    assert 5 <= scales.median().item() <= 20
    top2 = logits.topk(2, dim=-1).values
    gaps = top2[:, 0] - top2[:, 1]
    near_ties = sum(g <= 2 * bf16_step(s) for g, s in zip(gaps.tolist(), scales.tolist()))
    assert near_ties / len(gaps) < 0.25


def test_llama_1b_config_is_llama_3_2_1b_shaped():
    config = llama_1b_config()
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
            config.num_key_value_heads, config.vocab_size) == (2048, 16, 32, 8, 128256)
    assert rope_parameters(config)["rope_type"] == "llama3"
    assert not config.tie_word_embeddings  # see llama_1b_config: random tied models copy their input


@torch.no_grad()
def test_untied_model_does_not_just_copy_its_input(tiny_hf_model):
    ids = torch.randint(0, 512, (4, 32), generator=torch.Generator().manual_seed(1))
    predicted = tiny_hf_model(ids).logits.argmax(dim=-1)
    assert (predicted == ids).float().mean().item() < 0.05
