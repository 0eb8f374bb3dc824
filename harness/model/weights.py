"""Reloading weights into a built ReferenceLlama, in place, as a weight sync between training and
inference does: every parameter keeps its storage, so graphs captured against it see the new values.

ReferenceLlama runs fused projections (one GEMM for q, k and v, one for gate and up), so a
transformers state dict is fused on the way in (`fused_state_dict`): the fused weight is the
separate ones concatenated along the output dimension, in that order.
"""

from __future__ import annotations

import torch
from torch import nn

# fused parameter prefix -> the transformers prefixes it concatenates, in order
FUSED_PROJECTIONS = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def fused_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` (ReferenceLlama's names, unfused projections) with every layer's q/k/v and gate/up
    weights (and biases) concatenated into the fused parameters; other entries unchanged. A layer
    with only some of a fused group's parts keeps them unfused, so the load names what is missing."""
    fused = dict(state)
    for name in state:
        for target, parts in FUSED_PROJECTIONS.items():
            suffix = f".{parts[0]}.weight"
            if not name.endswith(suffix):
                continue
            layer = name[: -len(suffix)]
            for kind in ("weight", "bias"):
                names = [f"{layer}.{part}.{kind}" for part in parts]
                if all(n in state for n in names):
                    fused[f"{layer}.{target}.{kind}"] = torch.cat([state[n] for n in names], dim=0)
                    for n in names:
                        del fused[n]
    return fused


def hf_state_dict(hf_model) -> dict[str, torch.Tensor]:
    """A transformers LlamaForCausalLM's weights under ReferenceLlama's parameter names."""
    return fused_state_dict({name.removeprefix("model."): tensor
                             for name, tensor in hf_model.state_dict().items()
                             if not name.removeprefix("model.").startswith("rotary_emb.")})


def copy_into(param: torch.Tensor, new: torch.Tensor) -> None:
    """Write `new` into `param`'s own storage (never `param.data = new`: that moves it)."""
    param.copy_(new)


@torch.no_grad()
def reload_weights(model: nn.Module, hf_model) -> list[str]:
    """Copy `hf_model`'s weights into `model`'s parameters; returns the names written. A weight
    missing on either side, or of another shape, is a ValueError naming it."""
    params = dict(model.named_parameters())
    state = hf_state_dict(hf_model)
    unexpected = sorted(set(state) - set(params) - {"lm_head.weight"})
    missing = sorted(set(params) - set(state))
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {missing}, unexpected {unexpected}")
    written = []
    for name, param in params.items():
        new = state[name]
        if new.shape != param.shape:
            raise ValueError(f"weight {name}: shape {tuple(new.shape)} does not fit the parameter's "
                             f"{tuple(param.shape)}")
        copy_into(param, new.to(dtype=param.dtype, device=param.device))
        written.append(name)
    return written
