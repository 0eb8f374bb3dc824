"""Reloading weights into a built ReferenceLlama, in place, as a weight sync between training and
inference does: every parameter keeps its storage, so graphs captured against it see the new values."""

from __future__ import annotations

import torch
from torch import nn


def hf_state_dict(hf_model) -> dict[str, torch.Tensor]:
    """A transformers LlamaForCausalLM's weights under ReferenceLlama's parameter names."""
    return {name.removeprefix("model."): tensor for name, tensor in hf_model.state_dict().items()
            if not name.removeprefix("model.").startswith("rotary_emb.")}


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
