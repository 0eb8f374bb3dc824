"""`triton.autotune` on the emulated CUDA device: a config chosen without benchmarking.

An Autotuner times each config of its kernel with `do_bench` (CUDA events around real launches)
and keeps the fastest for the key's values. The emulated device has no timings to compare (its
kernels run through Triton's interpreter on the host, at no GPU's speed), so a launch whose
arguments are device memory takes the first config, after `prune_configs_by`'s
`early_config_prune` where the autotuner has one (a function of the arguments, as on CUDA); the
`perf_model` ranking is not asked (it models a GPU's speed). The choice is the launch's alone: it
is not written into the autotuner's cache (nor Triton's disk cache), so the same autotuner on a
real GPU after the emulation benchmarks as before. `best_config` says the choice, and a config's
`pre_hook` runs before the launch as on CUDA. Launches whose arguments are host tensors go to
Triton's own `Autotuner.run`.
"""

from __future__ import annotations

from typing import Any

from harness import triton_internals


def chosen_config(tuner: Any, args: tuple, kwargs: dict) -> Any:
    """The config a launch on the emulated device runs with (see the module docstring)."""
    configs = list(tuner.configs)
    prune = getattr(tuner, "early_config_prune", None)
    if len(configs) > 1 and prune is not None:
        configs = list(prune(configs, dict(zip(tuner.arg_names, args)), **kwargs))
        if not configs:
            raise triton_internals.get("AutotunerError")(
                "No valid autotuner configs after pruning. `early_config_prune` should return at "
                "least one config.")
    return configs[0]


def autotuner_run(original, on_device):
    """`Autotuner.run` for the emulation's duration; `on_device(args, kwargs)` says whether a
    launch's arguments are the emulated device's memory."""

    def run(self, *args, **kwargs):
        if not on_device(args, kwargs):
            return original(self, *args, **kwargs)
        config = chosen_config(self, args, kwargs)
        self.best_config = config
        options = config.all_kwargs()
        if config.pre_hook is not None:
            config.pre_hook({**dict(zip(self.arg_names, args)), **kwargs, **options})
        return self.fn.run(*args, **kwargs, **options)

    run.__wrapped__ = original
    return run


__all__ = ["autotuner_run", "chosen_config"]
