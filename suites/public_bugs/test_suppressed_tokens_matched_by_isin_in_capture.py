"""A captured decode step whose logits processor suppresses a list of tokens with `torch.isin`
(PyTorch #130078: `torch.isin(buffer, data)` inside a CUDA graph capture raised "operation not
permitted when stream is capturing" once the inputs were large, and captured with small ones;
transformers' `SuppressTokensLogitsProcessor` matches the vocabulary against its token list so).
CUDA's isin sorts once the test elements pass numpy's heuristic (here 64 against a vocabulary of
4096: the direct comparison stops at 33) and first calls `_unique` on both inputs, which reads the
number of unique values on the host, a sync the capture refuses. The harness gives CUDA's error,
naming the op and the user's line. Fixed: the suppression mask is built once before capture."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import CaptureInvalidatedError, CaptureSyncError

from suites.public_bugs._refusals import stream_kept

NOT_PERMITTED = "CUDA error: operation not permitted when stream is capturing"
VOCAB = 4096


class Suppressor:
    def __init__(self, token_ids: list[int], *, mask_built_once: bool):
        self.vocab = torch.arange(VOCAB, device="cuda")
        self.suppressed = torch.tensor(token_ids, device="cuda")
        self.mask = torch.isin(self.vocab, self.suppressed) if mask_built_once else None

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        mask = self.mask if self.mask is not None else torch.isin(self.vocab, self.suppressed)
        return logits.masked_fill(mask, float("-inf"))


def _captured(mask_built_once: bool):
    head = torch.randn(16, VOCAB, generator=torch.Generator().manual_seed(0)).to("cuda")
    suppress = Suppressor(list(range(0, 640, 10)), mask_built_once=mask_built_once)
    hidden = torch.zeros(2, 16, device="cuda")

    def step():
        return suppress(hidden @ head).argmax(-1)

    warmup = torch.cuda.Stream()
    warmup.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warmup):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(warmup)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens = step()
    return graph, hidden, head, tokens, suppress  # the mask lives as long as the graph


def test_isin_sorting_a_long_token_list_is_refused_in_cudas_words():
    # as on CUDA, capture_end fails after the refused call, which is its context
    with stream_kept(), pytest.raises(CaptureInvalidatedError) as ended:
        _captured(mask_built_once=False)
    refused = ended.value.__context__
    assert isinstance(refused, CaptureSyncError), refused
    assert str(refused).startswith(NOT_PERMITTED), refused
    assert "aten.isin" in str(refused) and "_unique" in str(refused)
    assert "test_suppressed_tokens_matched_by_isin_in_capture.py" in str(refused)


def test_a_mask_built_before_capture_suppresses_the_tokens_at_each_replay():
    graph, hidden, head, tokens, _ = _captured(mask_built_once=True)
    for seed in (1, 2):
        hidden.copy_(torch.randn(2, 16, generator=torch.Generator().manual_seed(seed)))
        graph.replay()
        logits = hidden @ head
        logits[:, 0:640:10] = float("-inf")
        assert tokens.tolist() == logits.argmax(-1).tolist()
        assert all(t % 10 or t >= 640 for t in tokens.tolist())
