"""ReferenceLlama's forward can be captured into a graph and replayed for later batches.

The engine's decode graphs (`EngineConfig(decode_graph_sizes=(8,))`) capture the decode step at a
padded size of 8 sequences (warmup_and_capture sizes the workspace first), and every decode batch
(which shrinks as requests finish) is copied into the same buffers, padded to 8, and replayed. The
generations must equal the eager engine's exactly: a replay runs the recorded ops on the same
inputs. Runs on the `graph_backend` of the session (emulated on CPU, real CUDA graphs on a GPU), and
on the session's engine path (`--engine-compile inductor`: the graphs capture the compiled step,
whose kernels round apart from the eager ops, so its generations equal eager's within BF16 steps).
"""

from __future__ import annotations

from dataclasses import replace

from fixtures.models import TINY_ENGINE_CONFIG, TINY_SEED
from harness.check import compare_generations, describe_moved, moved_tensors, snapshot_tensors
from harness.graphs.pointers import rebound_tensors, tensor_refs
from harness.model import ReferenceLlama, tiny_llama
from harness.model.weights import reload_weights
from harness.runtime.config import fill_unset
from harness.runtime.engine import Engine
from harness.runtime.decode.runner import DecodeGraphKey

PADDED = 8
GRAPH_CONFIG = replace(TINY_ENGINE_CONFIG, decode_graph_sizes=(PADDED,))
PRODUCER = str(DecodeGraphKey.of(PADDED))


def pointers(engine: Engine) -> dict:
    """The tensors a captured decode step reads by address, as they are now."""
    return {**engine.decode_graphs.runner.snapshot(),
            **snapshot_tensors(dict(engine.model.named_parameters()), "parameters")}


def tensors(engine: Engine) -> dict:
    """The tensor objects a captured decode step reads, by the paths of `pointers`."""
    refs = {}
    for name, root in {**engine.decode_graphs.runner.roots(),
                       "parameters": dict(engine.model.named_parameters())}.items():
        refs.update(tensor_refs(root, name))
    return refs


def after_capture(engine: Engine, addresses: dict, objects: dict) -> str:
    """What moved, and what was rebound (a new tensor, even at the old one's freed address)."""
    rebound = rebound_tensors(objects, tensors(engine))
    kept = {path: record for path, record in addresses.items() if path not in rebound}
    return (f"moved after capture: {describe_moved(kept, pointers(engine)) or 'nothing'}\n"
            f"rebound after capture: {', '.join(rebound) or 'nothing'}")


def steps_from_eager(compiled_path: bool) -> float:
    """How far a graphed run may be from eager's: not at all on the eager ops (a replay runs the
    same ops), the BF16-step comparison's default on the compiled path."""
    return 2 if compiled_path else 0


def test_decode_graph_replays_match_eager(graph_backend, device_reference_llama, grounding_requests,
                                          repro_scenario, engine_defaults, compiled_path):
    from harness.repro import Scenario

    config = fill_unset(GRAPH_CONFIG, engine_defaults)
    steps = steps_from_eager(compiled_path)
    repro_scenario.record(Scenario(backend=graph_backend.name, model_seed=TINY_SEED,
                                   engine=config.to_dict(), requests=grounding_requests,
                                   tolerance_steps=steps))
    eager = Engine(device_reference_llama, TINY_ENGINE_CONFIG).generate(grounding_requests)
    engine = Engine(device_reference_llama, config, backend=graph_backend)
    engine.prepare_graphs()
    captured, objects = pointers(engine), tensors(engine)
    try:
        replayed = engine.generate(grounding_requests)
    except Exception as error:
        raise AssertionError(f"{type(error).__name__}: {error}\n"
                             f"{after_capture(engine, captured, objects)}") from error
    producers = {s.producer for g in replayed for s in g.steps[1:]}
    assert producers == {PRODUCER}
    comparison = compare_generations(eager, replayed, steps=steps)
    assert comparison.ok, f"{comparison}\n{after_capture(engine, captured, objects)}"
    if not compiled_path:
        assert [g.tokens for g in replayed] == [g.tokens for g in eager]
    assert engine.stats.decode_batch_sizes()[-1] < PADDED  # smaller batches were padded and replayed


def test_weights_reloaded_after_capture_reach_the_graph(graph_backend, device, grounding_requests,
                                                        engine_defaults):
    # A weight sync (RL training -> inference) reloads weights under graphs that stay captured.
    model = ReferenceLlama.from_hf(tiny_llama(seed=TINY_SEED)).to(device)
    engine = Engine(model, fill_unset(GRAPH_CONFIG, engine_defaults), backend=graph_backend)
    engine.generate(grounding_requests[:2])  # captures the decode step
    parameters = snapshot_tensors(dict(model.named_parameters()))
    reload_weights(model, tiny_llama(seed=TINY_SEED + 1))
    moved = moved_tensors(parameters, snapshot_tensors(dict(model.named_parameters())))
    try:
        replayed = engine.generate(grounding_requests)
    except Exception as error:
        raise AssertionError(f"{len(moved)} parameters moved by the reload (the graph reads the old "
                             f"ones), e.g. {moved[:3]}: {type(error).__name__}: {error}") from error
    reloaded = ReferenceLlama.from_hf(tiny_llama(seed=TINY_SEED + 1)).to(device)
    eager = Engine(reloaded, TINY_ENGINE_CONFIG).generate(grounding_requests)
    comparison = compare_generations(eager, replayed)
    assert comparison.ok, (f"{comparison}\n{len(moved)} parameters moved by the reload "
                           f"(the graph reads the old ones), e.g. {moved[:3]}")
    # one capture per phase, before the reload, replayed after it
    assert dict(engine.stats.captures) == {PRODUCER: 2}


class HoldingEngine(Engine):
    """Keeps every ForwardResult and a private copy of its logits taken when it was returned."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.held = []

    def _forward(self, batch):
        result = super()._forward(batch)
        self.held.append((result, result.logits.clone()))
        return result


def test_forward_results_survive_later_replays(graph_backend, device_reference_llama,
                                               grounding_requests, engine_defaults):
    engine = HoldingEngine(device_reference_llama, fill_unset(GRAPH_CONFIG, engine_defaults),
                           backend=graph_backend)
    engine.generate(grounding_requests)
    replayed = [i for i, (result, _) in enumerate(engine.held) if result.producer != "eager"]
    assert len(replayed) > 2
    changed = [i for i in replayed if not engine.held[i][0].logits.equal(engine.held[i][1])]
    assert not changed, (f"the logits of steps {changed} changed under the holder after later "
                         f"replays: a graph output held across replays instead of copied out")
