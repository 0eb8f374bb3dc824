"""ReferenceLlama's forward can be captured into a graph and replayed for later batches.

The engine's `_forward` seam is used as the decode-graph dispatch of a later issue will use it: the
first decode batch is captured at a padded size of 8 sequences, and every decode batch after it (which
shrink as requests finish) is copied into the same buffers, padded to 8, and replayed. The generations
must equal the eager engine's exactly: a replay runs the recorded ops on the same inputs.
Runs on the `graph_backend` of the session (emulated on CPU, real CUDA graphs on a GPU).
"""

from __future__ import annotations

from fixtures.models import TINY_ENGINE_CONFIG
from harness.check import compare_generations
from harness.runtime.engine import Engine, ForwardResult

PADDED = 8


class OneDecodeGraph(Engine):
    graph = None

    def _forward(self, batch) -> ForwardResult:
        if batch.kind != "decode":
            return super()._forward(batch)
        self._prepare(batch, num_tokens=PADDED, num_seqs=PADDED)
        if self.graph is None:
            self.graph = self.backend.capture(lambda: self.model(self.input_ids, self.metadata, self.kv_cache))
        self.graph.replay()
        return ForwardResult(logits=self.graph.output[: batch.num_seqs], producer=f"decode_bs{PADDED}")


def test_decode_graph_replays_match_eager(graph_backend, device_reference_llama, grounding_requests):
    eager = Engine(device_reference_llama, TINY_ENGINE_CONFIG).generate(grounding_requests)
    engine = OneDecodeGraph(device_reference_llama, TINY_ENGINE_CONFIG, backend=graph_backend)
    replayed = engine.generate(grounding_requests)
    producers = {s.producer for g in replayed for s in g.steps[1:]}
    assert producers == {f"decode_bs{PADDED}"}
    assert [g.tokens for g in replayed] == [g.tokens for g in eager]
    comparison = compare_generations(eager, replayed, steps=0)
    assert comparison.ok, str(comparison)
    assert engine.stats.decode_batch_sizes()[-1] < PADDED  # smaller batches were padded and replayed
