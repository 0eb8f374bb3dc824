"""Attention metadata kept in buffers preallocated for the largest batch.

A captured graph reads these buffers by address, so `prepare()` copies each batch into them and
never rebinds a tensor. The host-side counts are what a graph freezes (they decide shapes and
slices), so they describe the padded batch, not the real one.

Layout of a prepared batch: real tokens first (prefill sequences, then decodes, each sequence's
tokens contiguous), then padded tokens up to `num_tokens`. Sequence rows likewise: real sequences,
then padded sequences up to `num_seqs`. Padded rows have seq_len 0, their tokens write K/V to the
cache's pad slot, and their block tables point only at the pad block. Row `max_batch_size` of
`seq_lens` and `block_tables` is a permanent padded sequence that every padded token belongs to.
"""

from __future__ import annotations

from dataclasses import dataclass
import itertools
import math
import operator
from typing import Sequence

import numpy as np
import torch

from harness.ops.current_stream import stream_device
from harness.ops.decode_kernel import DECODE_KERNELS
from harness.ops.decode_linear_choice import DECODE_LINEARS
from harness.ops.rope_kv_choice import ROPE_KV_WRITES
from harness.ops.sizing import cdiv, require_positive

_NUMPY = {torch.int32: np.int32, torch.int64: np.int64}
STAGING_BUFFERS = 2
# Up to this many sequences, prepare writes block tables one row at a time (cheaper than a mask).
ROW_BY_ROW_TABLES = 8


@dataclass(frozen=True)
class SequenceSpan:
    """A sequence of `seq_len` tokens (cached + new) whose last `query_len` tokens are in this
    batch; `block_table` lists its KV blocks in order. A prefill has query_len == seq_len (or
    more than one new token on top of a cached prefix); a decode adds one token to a cached prefix."""

    seq_len: int
    query_len: int
    block_table: Sequence[int]

    @property
    def is_decode(self) -> bool:
        return self.query_len == 1 and self.seq_len > 1


@dataclass(frozen=True)
class BatchCounts:
    """Host-side shape of a prepared batch. Padded sequences count as decodes and padded tokens as
    decode tokens, so prefills + decodes == num_seqs and the token split sums to num_tokens."""

    num_tokens: int
    num_seqs: int
    num_prefills: int
    num_prefill_tokens: int
    num_actual_tokens: int
    num_actual_seqs: int

    @property
    def num_decodes(self) -> int:
        return self.num_seqs - self.num_prefills

    @property
    def num_decode_tokens(self) -> int:
        return self.num_tokens - self.num_prefill_tokens


class AttentionMetadata:
    """Buffers (all on `device`):

    - `seq_lens` int32 [max_batch_size + 1]: tokens per sequence (0 for padding).
    - `query_start_loc` int32 [max_batch_size + 1]: first token row of each sequence; padded
      sequences own no rows, so entries past the real sequences hold `num_actual_tokens`.
    - `positions`, `slot_mapping`, `token_to_seq` int64 [max_num_tokens]: per token row.
    - `block_tables` int64 [max_batch_size + 1, max_blocks_per_seq]: unused entries = pad block.
    - `logits_indices` int64 [max_batch_size]: the row of each sequence's last token (padded
      sequences take a padded token row where one exists, else the last row).

    Each is a typed view of `flat`, one uint8 device buffer; `BUFFERS` names them in layout order.

    `decode_kernel` (one of `DECODE_KERNELS`, decode_kernel.py) is what attends decode-only batches:
    "torch" (the default) the gather path every batch takes, "triton" the paged-decode kernel.
    `rope_kv_write` (one of `ROPE_KV_WRITES`, rope_kv_choice.py) is how the model's layers rotate and
    store K/V: "separate" (the default) or "fused" (`harness::rope_kv_write` before attention).
    `decode_linear` (one of `DECODE_LINEARS`, decode_linear_choice.py) is how the model's linear
    layers run for decode-sized batches: "separate" (the default, torch ops) or "fused" (the decode
    GEMV ops with their norm, residual and SiLU-and-multiply).
    `pdl` (pdl_choice.py) is whether those ops' Triton kernels are launched with Programmatic
    Dependent Launch: False (the default) or True; the torch implementations ignore it.
    """

    BUFFERS = ("positions", "slot_mapping", "token_to_seq", "block_tables", "logits_indices",
               "seq_lens", "query_start_loc")

    def __init__(self, max_batch_size: int, max_num_tokens: int, max_blocks_per_seq: int,
                 block_size: int, pad_slot: int, device: torch.device | str = "cpu", *,
                 decode_kernel: str = "torch", rope_kv_write: str = "separate",
                 decode_linear: str = "separate", pdl: bool = False) -> None:
        require_positive(max_batch_size=max_batch_size, max_num_tokens=max_num_tokens,
                         max_blocks_per_seq=max_blocks_per_seq, block_size=block_size)
        if decode_kernel not in DECODE_KERNELS:
            raise ValueError(f"decode_kernel must be one of {list(DECODE_KERNELS)}, got "
                             f"{decode_kernel!r}")
        self.decode_kernel = decode_kernel
        if rope_kv_write not in ROPE_KV_WRITES:
            raise ValueError(f"rope_kv_write must be one of {list(ROPE_KV_WRITES)}, got "
                             f"{rope_kv_write!r}")
        self.rope_kv_write = rope_kv_write
        if decode_linear not in DECODE_LINEARS:
            raise ValueError(f"decode_linear must be one of {list(DECODE_LINEARS)}, got "
                             f"{decode_linear!r}")
        self.decode_linear = decode_linear
        if not isinstance(pdl, bool):
            raise ValueError(f"pdl must be True or False, got {pdl!r}")
        self.pdl = pdl
        if pad_slot < 0 or pad_slot % block_size:
            raise ValueError(f"pad_slot {pad_slot} must be the first slot of a block of {block_size}")
        self.max_batch_size = max_batch_size
        self.max_num_tokens = max_num_tokens
        self.max_blocks_per_seq = max_blocks_per_seq
        self.block_size = block_size
        self.pad_slot = pad_slot
        self.pad_block = pad_slot // block_size
        self.device = torch.device(device)
        # 0, 1, 2, ...: prepare slices the ranges it needs from it instead of building them.
        self._counting = np.arange(max(max_num_tokens + max_batch_size, max_blocks_per_seq),
                                   dtype=np.int64)

        shapes = {
            "positions": ((max_num_tokens,), torch.int64),
            "slot_mapping": ((max_num_tokens,), torch.int64),
            "token_to_seq": ((max_num_tokens,), torch.int64),
            "block_tables": ((max_batch_size + 1, max_blocks_per_seq), torch.int64),
            "logits_indices": ((max_batch_size,), torch.int64),
            "seq_lens": ((max_batch_size + 1,), torch.int32),
            "query_start_loc": ((max_batch_size + 1,), torch.int32),
        }
        # Every buffer is a typed view of one flat device buffer, and `prepare` fills the same layout
        # in one host staging buffer: one host-to-device copy per step instead of one per buffer.
        # The int64 buffers come first, so every view starts at a multiple of its element size.
        offsets, nbytes = {}, 0
        for name, (shape, dtype) in shapes.items():
            offsets[name] = nbytes
            nbytes += math.prod(shape) * dtype.itemsize
        flat = torch.zeros(nbytes, dtype=torch.uint8, device=self.device)
        self._stream_device = stream_device(flat.device)
        pinned = self.device.type == "cuda"
        # Two host staging buffers, used in turn: a non-blocking copy from pinned memory reads its
        # buffer when the device reaches it, so the host may fill one buffer for the next step while
        # the device has yet to read the other (the overlap loop stages step n + 1 while step n is
        # queued). Each buffer's event marks when the device has read it; `prepare` waits on the
        # event of the buffer it is about to fill, which is two steps old.
        self._stagings = tuple(torch.zeros(nbytes, dtype=torch.uint8, pin_memory=pinned)
                               for _ in range(STAGING_BUFFERS))
        self._staging_arrays = tuple(staging.numpy() for staging in self._stagings)
        # Where every step starts: every row padded, and query_start_loc and logits_indices holding
        # their row numbers. prepare copies it into a staging buffer and writes only the real rows
        # and the ends that depend on the batch over it.
        self._empty_batch = np.zeros(nbytes, dtype=np.uint8)
        buffers = (*self._staging_arrays, self._empty_batch)
        hosts: tuple[dict[str, np.ndarray], ...] = tuple({} for _ in buffers)
        for name, (shape, dtype) in shapes.items():
            start, end = offsets[name], offsets[name] + math.prod(shape) * dtype.itemsize
            setattr(self, name, flat[start:end].view(dtype).view(shape))
            for buffer, host in zip(buffers, hosts):
                host[name] = buffer[start:end].view(_NUMPY[dtype]).reshape(shape)
        self._hosts, empty = hosts[:-1], hosts[-1]
        empty["block_tables"].fill(self.pad_block)
        empty["token_to_seq"].fill(max_batch_size)  # the permanent padded sequence
        empty["slot_mapping"].fill(pad_slot)
        empty["query_start_loc"][:] = np.arange(max_batch_size + 1)
        empty["logits_indices"][:] = np.arange(max_batch_size)
        # The first buffer's arrays, by name (what every staging buffer holds).
        self._host = self._hosts[0]
        # Set after the views, so that tools naming a storage by its first path (the capture lint)
        # name a public buffer.
        self.flat = flat
        self._copies_done = tuple(torch.cuda.Event() if pinned else None for _ in self._stagings)
        self._turn = 0
        self.counts = BatchCounts(0, 0, 0, 0, 0, 0)
        self.prepare([])

    # Host counts, read by the wrapper ops and the model: what a captured graph freezes.
    @property
    def num_tokens(self) -> int:
        return self.counts.num_tokens

    @property
    def num_seqs(self) -> int:
        return self.counts.num_seqs

    @property
    def num_prefills(self) -> int:
        return self.counts.num_prefills

    @property
    def num_prefill_tokens(self) -> int:
        return self.counts.num_prefill_tokens

    @property
    def num_decodes(self) -> int:
        return self.counts.num_decodes

    @property
    def num_decode_tokens(self) -> int:
        return self.counts.num_decode_tokens

    @property
    def num_actual_tokens(self) -> int:
        return self.counts.num_actual_tokens

    @property
    def num_actual_seqs(self) -> int:
        return self.counts.num_actual_seqs

    @property
    def uses_decode_kernel(self) -> bool:
        """Whether this batch's attention runs the Triton decode kernel: it holds no prefill
        (padded sequences count as decodes) and `decode_kernel` is "triton"."""
        return self.decode_kernel == "triton" and self.counts.num_prefills == 0

    def input_positions(self) -> torch.Tensor:
        return self.positions[: self.num_tokens]

    def op_inputs(self) -> tuple[torch.Tensor, ...]:
        """What the attention ops read, cut to this batch's padded token rows: slot_mapping,
        positions, token_to_seq, seq_lens, block_tables."""
        tokens = self.num_tokens
        return (self.slot_mapping[:tokens], self.positions[:tokens], self.token_to_seq[:tokens],
                self.seq_lens, self.block_tables)

    def logits_rows(self) -> torch.Tensor:
        """Token rows whose hidden states become logits, one per sequence (padded ones included)."""
        return self.logits_indices[: self.num_seqs]

    def prepare(self, spans: Sequence[SequenceSpan], *, num_tokens: int | None = None,
                num_seqs: int | None = None) -> BatchCounts:
        """Copy a batch into the buffers, padded up to `num_tokens` token rows and `num_seqs`
        sequence rows (default: no padding). Call it outside capture: it builds host tensors."""
        # prepare runs every step, for a handful of sequences: per-sequence values stay Python lists
        # and are checked with builtins over them, which cost less than numpy calls on tiny arrays.
        n = len(spans)
        seq_lens = [span.seq_len for span in spans]
        query_lens = [span.query_len for span in spans]
        tables = [span.block_table for span in spans]
        table_lens = list(map(len, tables))
        block_ids = list(itertools.chain.from_iterable(tables))
        ends = list(itertools.accumulate(query_lens))  # one past each sequence's last token row
        actual_tokens = int(ends[-1]) if n else 0
        num_tokens = actual_tokens if num_tokens is None else num_tokens
        num_seqs = n if num_seqs is None else num_seqs
        is_decode = [q == 1 and s > 1 for q, s in zip(query_lens, seq_lens)]
        self._check_batch(spans, num_tokens, num_seqs, actual_tokens, seq_lens, query_lens,
                          table_lens, block_ids, is_decode)
        turn = self.next_staging()
        host, staging, copy_done = self._hosts[turn], self._stagings[turn], self._copies_done[turn]
        bs, counting = self.block_size, self._counting

        # From the empty batch: past the real rows, positions 0, slots the pad slot, token_to_seq
        # and block tables the pad sequence and block, seq_lens 0.
        np.copyto(self._staging_arrays[turn], self._empty_batch)
        block_tables = host["block_tables"]
        if n <= ROW_BY_ROW_TABLES:  # one slice assignment per row costs less than building a mask
            for i, table in enumerate(tables):
                block_tables[i, :len(table)] = table
        else:
            used = counting[:self.max_blocks_per_seq] < np.array(table_lens)[:, None]
            block_tables[:n][used] = block_ids
        host["seq_lens"][:n] = seq_lens
        token_to_seq, positions = host["token_to_seq"], host["positions"]
        slots = host["slot_mapping"]
        num_decodes = is_decode.count(True)
        num_prefills = n - num_decodes
        # Prefills first (the check made sure of it), one sequence at a time: token i of a query
        # sits at position seq_len - query_len + i.
        row = 0
        for i in range(num_prefills):
            end = row + query_lens[i]
            token_to_seq[row:end] = i
            np.add(counting[:query_lens[i]], seq_lens[i] - query_lens[i], out=positions[row:end])
            row = end
        if row:
            owner, prefill_positions = token_to_seq[:row], positions[:row]
            slots[:row] = block_tables[owner, prefill_positions // bs] * bs + prefill_positions % bs
        # Then the decodes, one token each at position seq_len - 1, computed as Python ints: for a
        # few values that costs less than numpy calls.
        decode_positions = [seq_len - 1 for seq_len in seq_lens[num_prefills:]]
        token_to_seq[row:actual_tokens] = counting[num_prefills:n]
        positions[row:actual_tokens] = decode_positions
        slots[row:actual_tokens] = [table[p // bs] * bs + p % bs
                                    for table, p in zip(tables[num_prefills:], decode_positions)]
        # query_start_loc: each sequence's first token row (start_loc[0] is 0 in the empty batch),
        # then actual_tokens. logits_indices: each sequence's last token row; padded sequence i
        # reads the i-th padded token row, so a padded decode batch keeps sequence j <-> token j,
        # and rows past num_tokens are clamped to stay in range.
        start_loc, logits_indices = host["query_start_loc"], host["logits_indices"]
        last_row = max(num_tokens - 1, 0)
        if num_prefills:
            start_loc[1:n + 1] = ends
            start_loc[n + 1:] = actual_tokens
            logits_indices[:n] = [end - 1 for end in ends]
            np.minimum(counting[actual_tokens:actual_tokens + self.max_batch_size - n], last_row,
                       out=logits_indices[n:])
        else:  # token row i is sequence i: both are the empty batch's row numbers, clamped
            start_loc[n + 1:] = n
            logits_indices[last_row:] = last_row
        self.flat.copy_(staging, non_blocking=copy_done is not None)
        if copy_done is not None:
            copy_done.record(torch.cuda.current_stream(self._stream_device))  # the copy's stream

        num_prefill_tokens = actual_tokens - num_decodes  # a decode has one new token
        # Positional: keywords make the frozen dataclass's constructor twice as slow.
        self.counts = BatchCounts(num_tokens, num_seqs, num_prefills, num_prefill_tokens,
                                  actual_tokens, n)
        return self.counts

    @property
    def stagings(self) -> tuple[torch.Tensor, ...]:
        """The host staging buffers `prepare` fills in turn (pinned where the device is cuda)."""
        return self._stagings

    def next_staging(self) -> int:
        """The staging buffer the next `prepare` fills, once the device has read it (its last copy
        is two prepares old, so on a queue no deeper than one step this does not wait)."""
        turn = self._turn
        self._turn = (turn + 1) % len(self._stagings)
        if self._copies_done[turn] is not None:
            self._copies_done[turn].synchronize()
        return turn

    def _check_batch(self, spans: Sequence[SequenceSpan], num_tokens: int, num_seqs: int,
                     actual_tokens: int, seq_lens: list[int], query_lens: list[int],
                     table_lens: list[int], block_ids: list[int], is_decode: list[bool]) -> None:
        """Refuse a batch that does not fit the buffers, naming the first bad sequence and its value.
        The checks run on whole lists (prepare runs every step); only a failure looks closer."""
        n = len(spans)
        if n > self.max_batch_size:
            raise ValueError(f"{n} sequences exceed max_batch_size {self.max_batch_size}")
        if not n <= num_seqs <= self.max_batch_size:
            raise ValueError(f"num_seqs {num_seqs} must lie in [{n} (real sequences), "
                             f"{self.max_batch_size} (max_batch_size)]")
        if actual_tokens > self.max_num_tokens:
            raise ValueError(f"{actual_tokens} tokens exceed max_num_tokens {self.max_num_tokens}")
        if not actual_tokens <= num_tokens <= self.max_num_tokens:
            raise ValueError(f"num_tokens {num_tokens} must lie in [{actual_tokens} (real tokens), "
                             f"{self.max_num_tokens} (max_num_tokens)]")
        if not n:
            return
        first_decode = is_decode.index(True) if True in is_decode else n
        failing = (min(query_lens) < 1 or any(map(operator.gt, query_lens, seq_lens))
                   or max(table_lens) > self.max_blocks_per_seq
                   or any(map(operator.lt, [k * self.block_size for k in table_lens], seq_lens))
                   # past the checks above every table holds a block (seq_len >= 1 needs one)
                   or min(block_ids) < 0 or max(block_ids) >= self.pad_block
                   or False in is_decode[first_decode:])  # a prefill after some decode
        if failing:
            raise ValueError(self._problem(spans))

    def _problem(self, spans: Sequence[SequenceSpan]) -> str:
        """The first sequence that fails a check, with the first check it fails."""
        bs, after_decode = self.block_size, False
        for i, span in enumerate(spans):
            seq_len, query_len, table = span.seq_len, span.query_len, span.block_table
            if not 1 <= query_len <= seq_len:
                return f"sequence {i}: query_len {query_len} must lie in [1, seq_len {seq_len}]"
            if len(table) > self.max_blocks_per_seq:
                return (f"sequence {i}: {len(table)} blocks exceed max_blocks_per_seq "
                        f"{self.max_blocks_per_seq}")
            if len(table) * bs < seq_len:
                return (f"sequence {i}: seq_len {seq_len} needs {cdiv(seq_len, bs)} blocks of "
                        f"{bs}, block_table has {len(table)}")
            bad = [b for b in table if not 0 <= b < self.pad_block]
            if bad:
                return (f"sequence {i}: block ids {bad} outside [0, {self.pad_block - 1}] "
                        f"(block {self.pad_block} is the pad sink)")
            if after_decode and not span.is_decode:
                return f"sequence {i} is a prefill after a decode: prefills come first"
            after_decode = after_decode or span.is_decode
        raise RuntimeError("a check over the whole batch failed but no sequence fails it: the two "
                           "forms of the checks disagree")
