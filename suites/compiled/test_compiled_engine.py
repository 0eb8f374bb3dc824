"""The compiled path (EngineConfig.compile="inductor"): inductor pieces between the attention ops,
decode graphs captured over the compiled step, on the session's graph backend (emulated on CPU,
cuda with --graph-backend cuda, the emulated device with --emulate-cuda), against the eager engine.

One compiled engine serves the module (inductor compiles each piece once per batch size; its cache
makes a second session cheap); the sizes 4, 2 and 1 are all replayed as the batch shrinks.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from fixtures.models import TINY_ENGINE_CONFIG, mixed_requests
from harness.check import compare_generations
from harness.runtime import Engine, EngineConfig
from harness.runtime.config import fill_unset
from harness.runtime.compiled.step import CompiledStep
from harness.runtime.engine import eager_compile_reason

SIZES = (4, 2, 1)
# Different lengths: the decode batch shrinks 4 -> 3 -> 2 -> 1, through every captured size.
MAX_NEW_TOKENS = (5, 9, 7, 11)


@pytest.fixture(scope="module")
def requests_():
    return mixed_requests(logprobs=2, prompt_lens=(3, 12, 7, 20), max_new_tokens=MAX_NEW_TOKENS)


@pytest.fixture(scope="module")
def eager_generations(device_reference_llama, requests_):
    return Engine(device_reference_llama, TINY_ENGINE_CONFIG).generate(requests_)


@pytest.fixture(scope="module")
def compiled_engine(device_reference_llama, graph_backend):
    config = replace(TINY_ENGINE_CONFIG, max_batch_size=4, decode_graph_sizes=SIZES, compile="inductor")
    return Engine(device_reference_llama, config, backend=graph_backend)


@pytest.fixture(scope="module")
def compiled_generations(compiled_engine, requests_):
    return compiled_engine.generate(requests_)


def test_compiled_decode_graphs_equal_the_eager_engine(eager_generations, compiled_generations,
                                                       compiled_engine):
    comparison = compare_generations(eager_generations, compiled_generations)
    assert comparison.ok, str(comparison)
    stats = compiled_engine.stats
    assert not stats.fallbacks, f"steps ran outside the graphs: {dict(stats.fallbacks)}"
    replayed = {key for key, count in stats.replays.items() if count}
    assert replayed == {f"decode[bs={s},greedy]" for s in SIZES}, replayed


def test_every_decode_step_is_the_compiled_one(compiled_generations, compiled_engine,
                                               device_reference_llama):
    step = compiled_engine.compiled_step
    decode_producers = {s.producer for g in compiled_generations for s in g.steps[1:]}
    assert decode_producers <= {f"decode[bs={s},greedy]" for s in SIZES}, decode_producers
    # One dynamo graph per captured size, none recompiled for phase 2's KV cache; each split into
    # a piece per layer boundary, compiled by inductor.
    assert step.compiles == len(SIZES)
    pieces_per_graph = device_reference_llama.num_layers + 1
    assert step.piece_compiles == len(SIZES) * pieces_per_graph


def test_a_compile_for_an_eager_batch_size_is_counted_apart_from_the_fallbacks(device_reference_llama,
                                                                              graph_backend):
    """A decode batch above every graph runs the compiled step outside the graphs: that is the
    batch's fallback, counted once by its route; the compile its first batch makes is the compiled
    path serving an eager size, counted in `eager_compiles`, once per size."""
    config = replace(TINY_ENGINE_CONFIG, max_batch_size=2, decode_graph_sizes=(1,), compile="inductor")
    engine = Engine(device_reference_llama, config, backend=graph_backend)
    requests = mixed_requests(logprobs=2, prompt_lens=(3, 9), max_new_tokens=(3, 5))
    generations = engine.generate(requests)
    eager = Engine(device_reference_llama, replace(config, decode_graph_sizes=(), compile="none"))
    comparison = compare_generations(eager.generate(requests), generations)
    assert comparison.ok, str(comparison)
    stats = engine.stats
    both = [b for b in stats.batches if b.kind == "decode" and b.num_seqs == 2]
    assert len(both) == 2  # the shorter request's two decode steps, with the longer one
    assert dict(stats.fallbacks) == {"decode batch of 2 exceeds the largest decode graph (1)": 2}
    assert dict(stats.eager_compiles) == {eager_compile_reason(2, 2): 1}


def test_a_shape_first_met_inside_a_capture_is_refused(device_reference_llama, graph_backend):
    """The compiled step compiles a shape at its first call; inside a capture that is refused with
    the shape and the remedy, not compiled into the recording."""
    engine = Engine(device_reference_llama, replace(TINY_ENGINE_CONFIG, max_batch_size=2))
    engine.prepare_padded((), num_tokens=2, num_seqs=2, input_ids=(0, 0))
    step = CompiledStep(device_reference_llama, graph_backend, engine.metadata.decode_kernel,
                        engine.metadata.rope_kv_write, engine.metadata.decode_linear,
                        engine.metadata.pdl)
    with pytest.raises(Exception, match=r"no compile for 2 token rows and 2 sequences, and dynamo would "
                                        r"compile it inside a graph capture"):
        graph_backend.capture(lambda: step(engine.input_ids, engine.metadata, engine.kv_cache))
    assert step.compiles == 0


@pytest.mark.parametrize("value", ["max-autotune", "", "None", True])
def test_an_unknown_compile_mode_is_named(value):
    with pytest.raises(ValueError, match=r"EngineConfig.compile must be one of \['none', 'inductor'\], "
                                         rf"got {value!r}"):
        EngineConfig(compile=value)


def test_the_compile_mode_round_trips_through_a_reproduction_file():
    config = EngineConfig(compile="inductor", decode_graph_sizes=(2, 1))
    assert EngineConfig.from_dict(config.to_dict()) == config


def test_a_session_default_fills_an_unset_compile_mode_and_keeps_a_given_one():
    """`--engine-compile inductor` reaches the suites' engines through `fill_unset`: a config that
    does not name a mode takes it, one that names "none" stays eager."""
    defaults = {"compile": "inductor"}
    assert EngineConfig().compile is None
    assert fill_unset(EngineConfig(), defaults).compile == "inductor"
    assert fill_unset(EngineConfig(compile="none"), defaults).compile == "none"


def test_engines_share_a_compiled_step_and_compile_each_shape_once(device_reference_llama, graph_backend):
    config = replace(TINY_ENGINE_CONFIG, max_batch_size=2, decode_graph_sizes=(2,), compile="inductor")
    first = Engine(device_reference_llama, config, backend=graph_backend)
    first.prepare_graphs()
    step = first.compiled_step
    compiles = step.compiles
    second = Engine(device_reference_llama, config, backend=graph_backend, compiled_step=step)
    second.prepare_graphs()
    assert second.compiled_step is step
    assert step.compiles == compiles, "the second engine compiled its shapes again"
    assert all(seconds > 0 for seconds in step.compile_seconds.values()) and step.compile_seconds


def test_a_shared_compiled_step_with_another_kv_cache_shape_compiles_it_apart(device_reference_llama,
                                                                            graph_backend):
    """The step runs dynamo's code for a shape without its guards: an engine sharing it with a KV
    cache of other sizes must get kernels of its own, not the first cache's."""
    config = replace(TINY_ENGINE_CONFIG, max_batch_size=2, decode_graph_sizes=(2,), compile="inductor")
    first = Engine(device_reference_llama, config, backend=graph_backend)
    first.prepare_graphs()
    step = first.compiled_step
    compiles = step.compiles
    bigger = Engine(device_reference_llama, replace(config, num_blocks=first.kv_cache.num_blocks + 3),
                    backend=graph_backend, compiled_step=step)
    bigger.prepare_graphs()
    assert step.compiles > compiles


def test_a_compiled_step_of_another_backend_or_mode_is_refused(device_reference_llama, graph_backend):
    config = replace(TINY_ENGINE_CONFIG, max_batch_size=2, compile="inductor")
    step = Engine(device_reference_llama, config).compiled_step  # no graphs: no backend
    with pytest.raises(ValueError, match=r"built for another model or graph backend \(None, this "
                                         rf"engine's is {graph_backend.name}\)"):
        Engine(device_reference_llama, replace(config, decode_graph_sizes=(2,)), backend=graph_backend,
               compiled_step=step)
    with pytest.raises(ValueError, match=r"compiled_step was given to an engine of "
                                         r"EngineConfig.compile='none'"):
        Engine(device_reference_llama, replace(config, compile="none"), compiled_step=step)
