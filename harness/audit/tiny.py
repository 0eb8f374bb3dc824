"""Tiny seeded models of transformers' causal LM architectures, built from each config class with
small overrides: no download, no checkpoint, a few MB of weights."""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Any

import torch

# Standard config names; a config class maps them to its own through `attribute_map`. Values are
# consistent with one another (64 = 4 heads x 16), so a model that derives one from the others agrees.
TINY_OVERRIDES: dict[str, Any] = dict(
    num_hidden_layers=2,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=512,
    max_position_embeddings=512,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    # Mixture-of-experts models: few, small experts.
    num_experts=4,
    num_local_experts=4,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=64,
    shared_expert_intermediate_size=64,
)
# State-space layers (Mamba-2 mixers of hybrid models): their sizes do not follow hidden_size, and
# the default 128 heads x 256 states x 256-token chunks take minutes and gigabytes per forward on a
# CPU. Applied only to a config that already has the key, as some names (`chunk_size`, `n_groups`)
# mean other things elsewhere; 8 heads x 16 = 2 x hidden_size, as the mixers require.
STATE_SPACE_OVERRIDES: dict[str, Any] = dict(
    mamba_n_heads=8, mamba_num_heads=8, mamba_d_head=16, mamba_head_dim=16, mamba_d_ssm=128,
    mamba_d_state=16, ssm_state_size=16, mamba_chunk_size=16, chunk_size=16, mamba_n_groups=1,
    n_groups=1,
)
# Sizes some configs keep under their own names, which `attribute_map` does not reach. Applied only
# to a config whose defaults have the key (and, for the ones in OPTIONAL_SIZES, a value), since a
# name absent from a config means nothing to it; every value agrees with TINY_OVERRIDES.
PRESENT_OVERRIDES: dict[str, Any] = dict(
    # Partial rotary (GPT-J, CodeGen): the rotated part must fit in a 16-wide head.
    rotary_dim=16,
    # Encoder-decoder configs used as decoders (Whisper, PLBart, Blenderbot, ProphetNet).
    d_model=64, encoder_layers=2, decoder_layers=2, num_encoder_layers=2, num_decoder_layers=2,
    encoder_attention_heads=4, decoder_attention_heads=4, num_encoder_attention_heads=4,
    num_decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
    # Multi-head latent attention (DeepSeek V2/V3 and their kind): rope + nope = the 16-wide q/k head.
    kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
    # Sparse attention indexers (DeepSeek V3.2, GLM-DSA), and expert groups of the 4 experts.
    index_n_heads=4, index_head_dim=16, index_topk=8, n_group=1, topk_group=1,
    # XLNet's head size, which no standard name maps to; MusicGen's codebooks (one: the audit's
    # prompts are one token stream).
    d_head=16, num_codebooks=1,
    # Shared experts: one, where a config has the key (Dots1 defaults it to None and multiplies it).
    n_shared_experts=1, moe_shared_expert_intermediate_size=64,
    # Per-layer input embeddings (Gemma 3n/4): the default table is 262144 x (layers x 256).
    vocab_size_per_layer_input=512, hidden_size_per_layer_input=16,
    # Layers that reuse another layer's KV cache: none of the two tiny layers can produce for
    # 15 sharers (Gemma 3n/4's default).
    num_kv_shared_layers=0,
    # Hashed byte n-gram embeddings (BLT): 6 tables of 500002 rows by default.
    encoder_hash_byte_group_vocab=512,
    # GPT-Neo: one (global, local) pair of layers, repeated once, for the 2 layers.
    attention_types=[[["global", "local"], 1]],
    q_lora_rank=32,
)
# Of PRESENT_OVERRIDES, the sizes whose None or 0 means "off" (no low-rank query, no per-layer
# inputs): kept off.
OPTIONAL_SIZES = frozenset({"q_lora_rank", "vocab_size_per_layer_input", "hidden_size_per_layer_input"})
# Above this many parameters the overrides did not reach the model (a default-sized sub-model).
MAX_PARAMS = 20_000_000


class BuildError(RuntimeError):
    """The architecture does not build from a tiny config; the message says why."""


@dataclass(frozen=True)
class Architecture:
    model_type: str
    class_name: str


def causal_lm_architectures() -> list[Architecture]:
    """Every (model_type, class) of transformers' MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, sorted by type."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return [Architecture(t, c) for t, c in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items())]


def tiny_config(model_type: str) -> Any:
    """The architecture's config class with the tiny overrides applied to it and to its sub-configs.

    Overrides a config cannot take are left out, not forced: a read-only property (Falcon's
    `head_dim`, derived from the sizes set) or a setter that refuses (ProphetNet's
    `num_hidden_layers`, XLNet's `max_position_embeddings`). Lists with one entry per layer
    (`layer_types`) are cut to the tiny layer count. Multi-head latent attention keeps as many KV
    heads as query heads: its keys are per-head already."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    sub_keys = list(getattr(config_class, "sub_configs", {}) or {})
    try:
        default = config_class()
        defaults = default.to_dict()
    except Exception:
        default, defaults = None, {}
    overrides = _settable(config_class, default, dict(TINY_OVERRIDES))
    if any(key.startswith(("mamba_", "ssm_")) for key in defaults):
        overrides.update({k: v for k, v in STATE_SPACE_OVERRIDES.items() if k in defaults})
    overrides.update(_present_overrides(defaults))
    if "kv_lora_rank" in defaults:
        overrides.update(_latent_attention(overrides))
    if "state_size" in defaults and "expand" in defaults:
        overrides.update(_mamba2_heads(defaults))
    overrides.update(_per_layer_lists(defaults, TINY_OVERRIDES["num_hidden_layers"]))
    subs = {k: _sub_overrides(config_class, k, overrides) for k in sub_keys}
    try:
        return _construct(config_class, overrides, subs)
    except Exception:
        return _construct(config_class, overrides, {})


def _construct(config_class: Any, overrides: dict[str, Any], subs: dict[str, Any]) -> Any:
    """The config; where its validation refuses an override by name ("ZAYA currently supports
    `num_experts_per_tok=1` only"), once more without that override, for each one named."""
    overrides = dict(overrides)
    while True:
        try:
            return config_class(**overrides, **subs)
        except Exception as error:
            text = " ".join(str(e) for e in (error, error.__cause__) if e is not None)
            named = [key for key in overrides if key in text and key not in subs]
            if not named:
                raise
            # The longest name first: "head_dim" is also inside "qk_rope_head_dim".
            del overrides[max(named, key=len)]


def _latent_attention(overrides: dict[str, Any]) -> dict[str, Any]:
    """Multi-head latent attention: its keys are per query head already (as many KV heads as
    query heads), and its rotary embedding is as wide as the rope part of the head."""
    return dict(num_key_value_heads=overrides["num_attention_heads"],
                head_dim=PRESENT_OVERRIDES["qk_rope_head_dim"])


def _mamba2_heads(defaults: dict[str, Any]) -> dict[str, Any]:
    """A pure Mamba-2 config's mixer sizes, which must multiply to expand x hidden_size."""
    heads = defaults["expand"] * TINY_OVERRIDES["hidden_size"] // TINY_OVERRIDES["head_dim"]
    sizes = dict(num_heads=heads, state_size=16, chunk_size=16, n_groups=1)
    return {key: value for key, value in sizes.items() if key in defaults}


def config_for(model_class: Any, config: Any) -> Any:
    """The config `model_class` takes: `config` itself, or the sub-config of the class the model
    declares (a text-only model of a multimodal config, as Llama 4's, Emu3's, Qwen3.5's)."""
    wanted = getattr(model_class, "config_class", None)
    if wanted is None or isinstance(config, wanted):
        return config
    for key in getattr(type(config), "sub_configs", {}) or {}:
        sub = getattr(config, key, None)
        if isinstance(sub, wanted):
            return sub
    # A config of a kind the class reuses (Sarvam-MLA's for DeepSeek V3's model) is taken as it is.
    return config


def _settable(config_class: Any, default: Any, overrides: dict[str, Any]) -> dict[str, Any]:
    """`overrides` less the keys the config class does not let one set."""
    kept = {}
    for key, value in overrides.items():
        name = (getattr(config_class, "attribute_map", {}) or {}).get(key, key)
        attribute = inspect.getattr_static(config_class, name, None)
        if isinstance(attribute, property):
            if attribute.fset is None:
                continue
            if default is not None:
                try:
                    setattr(copy.copy(default), name, value)
                except (NotImplementedError, AttributeError):
                    continue
        kept[key] = value
    return kept


def _present_overrides(defaults: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in PRESENT_OVERRIDES.items()
            if key in defaults and not (key in OPTIONAL_SIZES and not defaults[key])}


def _per_layer_lists(defaults: dict[str, Any], layers: int) -> dict[str, Any]:
    """Lists of one entry per default layer, cut to `layers` that keep one layer of each kind, in
    the order the kinds first appear, so that a hybrid's attention path is built (Qwen3.5's and
    Kimi-Linear's full-attention layer comes after three linear ones; the first two would be all
    linear, and their audit rows "no static cache" for want of an attention layer). With more kinds
    than layers the last layer keeps its own kind (a full-attention last layer some configs require);
    a producing kind stays before its consumers (HY-V4's full indexer before the shared ones)."""
    count = defaults.get("num_hidden_layers")
    if not isinstance(count, int) or count <= layers:
        return {}
    cut = {}
    for key, value in defaults.items():
        if not isinstance(value, list) or len(value) != count or key in PRESENT_OVERRIDES:
            continue
        try:
            kinds = list(dict.fromkeys(value))
        except TypeError:  # unhashable entries (per-layer dicts): the first layers and the last
            cut[key] = value[:layers - 1] + value[-1:]
            continue
        if len(kinds) > layers and value[-1] not in kinds[:layers]:
            kinds = kinds[:layers - 1] + [value[-1]]
        cut[key] = (kinds + [kinds[-1]] * layers)[:layers]
    return cut


def _sub_overrides(config_class: Any, key: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The overrides for one sub-config: the parent's, less what its class refuses, plus its own
    present keys and per-layer lists."""
    sub_class = (getattr(config_class, "sub_configs", {}) or {}).get(key)
    try:
        sub_default = sub_class()
        sub_defaults = sub_default.to_dict()
    except Exception:
        return dict(overrides)
    sub = _settable(type(sub_default), sub_default, dict(overrides))
    sub.update(_present_overrides(sub_defaults))
    if "kv_lora_rank" in sub_defaults:
        sub.update(_latent_attention(overrides))
    sub.update(_per_layer_lists(sub_defaults, TINY_OVERRIDES["num_hidden_layers"]))
    return sub


def build_tiny(arch: Architecture, dtype: torch.dtype, seed: int = 0, device: str = "cpu") -> Any:
    """The model, seeded, in eval mode; BuildError with the reason when it does not build tiny."""
    import transformers

    model_class = getattr(transformers, arch.class_name, None)
    if model_class is None:
        raise BuildError(f"transformers has no class {arch.class_name}")
    try:
        config = config_for(model_class, tiny_config(arch.model_type))
        with torch.device("meta"):
            shape_only = model_class(config)
        params = sum(p.numel() for p in shape_only.parameters())
    except Exception as error:
        raise BuildError(f"{type(error).__name__}: {_first_line(error)}") from error
    if params > MAX_PARAMS:
        raise BuildError(f"{params / 1e6:.0f}M parameters after the tiny overrides (limit "
                         f"{MAX_PARAMS / 1e6:.0f}M): a sub-model keeps its default size")
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = model_class(config)
        _choose_default_language(model, config)
        return model.to(device=device, dtype=dtype).eval()
    except Exception as error:
        raise BuildError(f"{type(error).__name__}: {_first_line(error)}") from error


def _choose_default_language(model: Any, config: Any) -> None:
    """X-MOD's adapters refuse a forward until a language is chosen: the config's first."""
    languages = getattr(config, "languages", None)
    if hasattr(model, "set_default_language") and languages:
        model.set_default_language(list(languages)[0])


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else ""
