"""A decode step captured inside the same `torch.autocast("cuda")` region as its warmup: the
warmup's float16 casts of the weights sit in autocast's cache, the capture reads the cached copies
instead of casting, and the region's exit clears the cache, freeing memory the graph still reads
(PyTorch #71631: different results with autocast and CUDA graphs; #81558 and #84289 cleared, then
disabled, the cache in `make_graphed_callables`). On CUDA the replay reads freed memory, and a
weight update is never seen; the harness refuses the replay, naming the capture's line. Fixed:
`cache_enabled=False`, so the capture records the casts and each replay casts the live weights.
`make_graphed_callables` refuses the cache itself, with torch's own message."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import FreedMemoryError


class Decoder:
    def __init__(self) -> None:
        self.proj = torch.nn.Linear(8, 8, bias=False, device="cuda")
        with torch.no_grad():
            self.proj.weight.fill_(0.5)
        self.x = torch.ones(2, 8, device="cuda")
        self.out = torch.zeros(2, 8, dtype=torch.float16, device="cuda")
        self.graph = torch.cuda.CUDAGraph()

    def capture(self, *, cache_enabled: bool) -> None:
        with torch.autocast("cuda", dtype=torch.float16, cache_enabled=cache_enabled):
            for _ in range(2):
                self.proj(self.x)  # warmup, as runtimes do before capture
            torch.cuda.synchronize()
            with torch.cuda.graph(self.graph):
                self.out.copy_(self.proj(self.x))

    def update_weights(self, value: float) -> None:
        with torch.no_grad():
            self.proj.weight.fill_(value)


def test_a_capture_reading_autocasts_cached_weights_is_refused_at_replay():
    decoder = Decoder()
    decoder.capture(cache_enabled=True)
    decoder.update_weights(1.0)
    with pytest.raises(FreedMemoryError, match="test_autocast_cached_cast_in_capture.py"):
        decoder.graph.replay()


def test_a_capture_without_the_cache_casts_the_updated_weights_at_replay():
    decoder = Decoder()
    decoder.capture(cache_enabled=False)
    decoder.update_weights(1.0)
    decoder.graph.replay()
    assert decoder.out.dtype == torch.float16
    assert decoder.out.tolist() == [[8.0] * 8] * 2


def test_make_graphed_callables_refuses_autocasts_cache():
    proj = torch.nn.Linear(8, 8, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        with pytest.raises(RuntimeError, match="does not support the autocast caching"):
            torch.cuda.make_graphed_callables(proj, (torch.ones(2, 8, device="cuda"),))
