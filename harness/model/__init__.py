"""Reference Llama-shaped decoder on the harness ops, and seeded transformers models to load it from."""

from harness.model.configs import llama_1b_config, tiny_llama_config
from harness.model.random_init import random_llama, tiny_llama

__all__ = ["ReferenceLlama", "llama_1b_config", "random_llama", "tiny_llama", "tiny_llama_config"]


def __getattr__(name: str):
    # ReferenceLlama needs harness.ops; import it on first use so configs work without it.
    if name == "ReferenceLlama":
        from harness.model.llama import ReferenceLlama
        return ReferenceLlama
    raise AttributeError(f"module 'harness.model' has no attribute {name!r}")
