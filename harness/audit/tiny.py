"""Tiny seeded models of transformers' causal LM architectures, built from each config class with
small overrides: no download, no checkpoint, a few MB of weights."""

from __future__ import annotations

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
    """The architecture's config class with TINY_OVERRIDES applied to it and to its sub-configs."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    sub_keys = list(getattr(config_class, "sub_configs", {}) or {})
    overrides = dict(TINY_OVERRIDES)
    try:
        defaults = config_class().to_dict()
    except Exception:
        defaults = {}
    if any(key.startswith(("mamba_", "ssm_")) for key in defaults):
        overrides.update({k: v for k, v in STATE_SPACE_OVERRIDES.items() if k in defaults})
    try:
        config = config_class(**overrides, **{k: dict(overrides) for k in sub_keys})
    except Exception:
        config = config_class(**overrides)
    return config


def build_tiny(arch: Architecture, dtype: torch.dtype, seed: int = 0, device: str = "cpu") -> Any:
    """The model, seeded, in eval mode; BuildError with the reason when it does not build tiny."""
    import transformers

    model_class = getattr(transformers, arch.class_name, None)
    if model_class is None:
        raise BuildError(f"transformers has no class {arch.class_name}")
    try:
        config = tiny_config(arch.model_type)
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
        return model.to(device=device, dtype=dtype).eval()
    except Exception as error:
        raise BuildError(f"{type(error).__name__}: {_first_line(error)}") from error


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else ""
