"""Deterministic batching: which sequences run in the next step, and their KV blocks.

Every step decodes all running sequences and then admits waiting requests, in request order, while
the batch has room (sequences, token rows, KV blocks). With the usual limits every request is
admitted on the first step, a prefill of all prompts, and later steps are decodes that shrink as
requests of different lengths finish. Admission depends only on the requests and the config, so two
runs step through the same batches. A request's blocks are reserved for its whole length when it is
admitted (no preemption) and released the step it finishes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from harness.ops.kv_cache import BlockAllocator
from harness.ops.metadata import SequenceSpan
from harness.records import Request, Step
from harness.runtime.validation import blocks_needed


PENDING_TOKEN = 0  # the host's placeholder for a token still on the device


class Sequence:
    """A running request: its tokens so far (prompt + generated), KV blocks and generated steps."""

    def __init__(self, index: int, request: Request) -> None:
        self.index = index
        self.request = request
        self.tokens = list(request.prompt)
        self.num_cached = 0  # tokens whose K/V is in the cache
        # Sampled on the device but not yet read by the host (the overlap loop): the next step feeds
        # it from the device, so it counts in the span but its value is unknown here.
        self.pending = 0
        self.blocks: list[int] = []
        self.steps: list[Step] = []

    @property
    def finished(self) -> bool:
        return len(self.steps) >= self.request.max_new_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.tokens) + self.pending

    def span(self) -> SequenceSpan:
        return SequenceSpan(seq_len=self.num_tokens, query_len=self.num_tokens - self.num_cached,
                            block_table=tuple(self.blocks))

    def new_tokens(self) -> list[int]:
        """The tokens this step feeds; a pending token (its value still on the device) reads
        PENDING_TOKEN here and is fed from the device."""
        return self.tokens[self.num_cached:] + [PENDING_TOKEN] * self.pending


@dataclass(frozen=True)
class ScheduledBatch:
    """One step's sequences, prefills first; `kind` is "prefill", "decode" or "mixed".

    `spans` and `input_ids` are taken when the batch is scheduled: the sequences move on when the
    step finishes, and a batch must keep describing the step it was made for.
    """

    sequences: tuple[Sequence, ...]
    num_prefills: int
    spans: tuple[SequenceSpan, ...]
    input_ids: tuple[int, ...]

    @classmethod
    def of(cls, sequences: list[Sequence], num_prefills: int) -> ScheduledBatch:
        return cls(sequences=tuple(sequences), num_prefills=num_prefills,
                   spans=tuple(s.span() for s in sequences),
                   input_ids=tuple(t for s in sequences for t in s.new_tokens()))

    @property
    def kind(self) -> str:
        if self.num_prefills == len(self.sequences):
            return "prefill"
        return "decode" if self.num_prefills == 0 else "mixed"

    @property
    def num_seqs(self) -> int:
        return len(self.sequences)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)


class Scheduler:
    def __init__(self, allocator: BlockAllocator, *, max_batch_size: int, max_num_tokens: int,
                 block_size: int, lookahead_tokens: int = 0) -> None:
        self.allocator = allocator
        self.lookahead_tokens = lookahead_tokens
        self.max_batch_size = max_batch_size
        self.max_num_tokens = max_num_tokens
        self.block_size = block_size
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, sequence: Sequence) -> None:
        self.waiting.append(sequence)

    @property
    def done(self) -> bool:
        return not self.waiting and not self.running

    def schedule(self) -> ScheduledBatch:
        decodes = list(self.running)
        prefills: list[Sequence] = []
        tokens = len(decodes)
        while self.waiting:
            candidate = self.waiting[0]
            prompt = len(candidate.tokens)
            blocks = blocks_needed(candidate.request, self.block_size, self.lookahead_tokens)
            if (len(decodes) + len(prefills) + 1 > self.max_batch_size
                    or tokens + prompt > self.max_num_tokens
                    or blocks > self.allocator.num_free):
                break
            self.waiting.popleft()
            candidate.blocks = self.allocator.allocate(blocks)
            prefills.append(candidate)
            tokens += prompt
        if not prefills and not decodes:
            head = self.waiting[0]
            raise RuntimeError(f"request {head.index} cannot be scheduled on an idle engine "
                               f"(it passed validation: a scheduler bug)")
        self.running = prefills + decodes
        return ScheduledBatch.of(prefills + decodes, num_prefills=len(prefills))

    def finish_step(self, batch: ScheduledBatch) -> list[Sequence]:
        """Mark the batch's tokens cached, release finished sequences' blocks, return those."""
        finished = []
        for sequence in batch.sequences:
            sequence.num_cached = len(sequence.tokens) - 1  # the token just sampled is not cached yet
            if sequence.finished:
                self.allocator.free(sequence.blocks)
                sequence.blocks = []
                finished.append(sequence)
        self.running = [s for s in self.running if not s.finished]
        return finished

    def launched(self, batch: ScheduledBatch) -> None:
        """The overlap loop's half of `finish_step`, at launch: the batch's tokens are cached and
        each sequence has one more token pending on the device."""
        for sequence in batch.sequences:
            sequence.num_cached = sequence.num_tokens
            sequence.pending += 1

    def retire_finished(self) -> list[Sequence]:
        """The other half, once the host has read a step: release the sequences it finished."""
        finished = [s for s in self.running if s.finished]
        for sequence in finished:
            self.allocator.free(sequence.blocks)
            sequence.blocks = []
        self.running = [s for s in self.running if not s.finished]
        return finished
