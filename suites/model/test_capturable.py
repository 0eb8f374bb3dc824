"""ReferenceLlama's forward can be captured into a graph and replayed for later batches.

`StepCaptureEngine` captures the first decode batch at a padded size of 8 sequences, and every decode
batch after it (which shrink as requests finish) is copied into the same buffers, padded to 8, and
replayed. The generations must equal the eager engine's exactly: a replay runs the recorded ops on the
same inputs. Runs on the `graph_backend` of the session (emulated on CPU, real CUDA graphs on a GPU).
"""

from __future__ import annotations

from fixtures.models import TINY_ENGINE_CONFIG, TINY_SEED
from harness.check import compare_generations, describe_moved, moved_tensors, snapshot_tensors
from harness.model import ReferenceLlama, tiny_llama
from harness.model.weights import reload_weights
from harness.runtime.engine import Engine
from harness.runtime.step_capture import StepCaptureEngine, step_producer

PADDED = 8


def test_decode_graph_replays_match_eager(graph_backend, device_reference_llama, grounding_requests,
                                          repro_scenario):
    from harness.repro import Scenario

    repro_scenario.record(Scenario(backend=graph_backend.name, model_seed=TINY_SEED,
                                   engine=TINY_ENGINE_CONFIG.to_dict(), requests=grounding_requests,
                                   step_capture_sizes=(PADDED,), tolerance_steps=0))
    eager = Engine(device_reference_llama, TINY_ENGINE_CONFIG).generate(grounding_requests)
    engine = StepCaptureEngine(device_reference_llama, TINY_ENGINE_CONFIG, backend=graph_backend,
                               sizes=(PADDED,))
    replayed = engine.generate(grounding_requests)
    producers = {s.producer for g in replayed for s in g.steps[1:]}
    assert producers == {step_producer(PADDED)}
    comparison = compare_generations(eager, replayed, steps=0)
    moved = describe_moved(engine.captured_pointers[PADDED], engine.pointers())
    assert comparison.ok, f"{comparison}\nmoved after capture: {moved}"
    assert [g.tokens for g in replayed] == [g.tokens for g in eager]
    assert engine.stats.decode_batch_sizes()[-1] < PADDED  # smaller batches were padded and replayed


def test_weights_reloaded_after_capture_reach_the_graph(graph_backend, device, grounding_requests):
    # A weight sync (RL training -> inference) reloads weights under graphs that stay captured.
    model = ReferenceLlama.from_hf(tiny_llama(seed=TINY_SEED)).to(device)
    engine = StepCaptureEngine(model, TINY_ENGINE_CONFIG, backend=graph_backend, sizes=(PADDED,))
    engine.generate(grounding_requests[:2])  # captures the decode step
    parameters = snapshot_tensors(dict(model.named_parameters()))
    reload_weights(model, tiny_llama(seed=TINY_SEED + 1))
    moved = moved_tensors(parameters, snapshot_tensors(dict(model.named_parameters())))
    replayed = engine.generate(grounding_requests)
    reloaded = ReferenceLlama.from_hf(tiny_llama(seed=TINY_SEED + 1)).to(device)
    eager = Engine(reloaded, TINY_ENGINE_CONFIG).generate(grounding_requests)
    comparison = compare_generations(eager, replayed)
    assert comparison.ok, (f"{comparison}\n{len(moved)} parameters moved by the reload "
                           f"(the graph reads the old ones), e.g. {moved[:3]}")
    assert list(engine.graphs) == [PADDED]  # one capture, before the reload, replayed after it


class HoldingEngine(StepCaptureEngine):
    """Keeps every ForwardResult and a private copy of its logits taken when it was returned."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.held = []

    def _forward(self, batch):
        result = super()._forward(batch)
        self.held.append((result, result.logits.clone()))
        return result


def test_forward_results_survive_later_replays(graph_backend, device_reference_llama,
                                               grounding_requests):
    engine = HoldingEngine(device_reference_llama, TINY_ENGINE_CONFIG, backend=graph_backend,
                           sizes=(PADDED,))
    engine.generate(grounding_requests)
    replayed = [i for i, (result, _) in enumerate(engine.held) if result.producer != "eager"]
    assert len(replayed) > 2
    changed = [i for i in replayed if not engine.held[i][0].logits.equal(engine.held[i][1])]
    assert not changed, (f"the logits of steps {changed} changed under the holder after later "
                         f"replays: a graph output held across replays instead of copied out")
