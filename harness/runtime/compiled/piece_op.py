"""`harness::compiled_piece`: an inductor-compiled piece as one opaque op.

A recording at the dispatcher (the emulated backend, records_dispatched_ops_only) sees none of the
C++ kernels inductor writes for a CPU: they would run once, at capture, and be missing from every
replay. Called through this op, the piece is recorded as one op with its arguments and replayed by
calling it again (the graph contract's rule 5, opaque custom ops). Its fake runs the piece's FX
code, uncompiled, so the recording sizes its outputs without running it.

A custom op's arguments are tensors and scalars, so the piece travels as an id: `register` hands
one out and keeps the piece by weak reference, so the table never keeps a dead engine's pieces.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any, Protocol

import torch


class OpaquePiece(Protocol):
    def run_compiled(self, args: list[Any]) -> list[torch.Tensor]: ...

    def run_fake(self, args: list[Any]) -> list[torch.Tensor]: ...

    def join(self, tensors: list[torch.Tensor], scalars: list[int]) -> list[Any]: ...


# Process-wide by necessity: the op reaches its piece by id (module docstring).
_PIECES: "weakref.WeakValueDictionary[int, OpaquePiece]" = weakref.WeakValueDictionary()
_IDS = itertools.count()


def register(piece: OpaquePiece) -> int:
    piece_id = next(_IDS)
    _PIECES[piece_id] = piece
    return piece_id


def _piece(piece_id: int) -> OpaquePiece:
    piece = _PIECES.get(piece_id)
    if piece is None:
        raise RuntimeError(f"harness::compiled_piece: piece {piece_id} is gone (its engine was "
                           f"released); a graph that still calls it must be reset first")
    return piece


@torch.library.custom_op("harness::compiled_piece", mutates_args=())
def compiled_piece(piece_id: int, tensors: list[torch.Tensor], scalars: list[int]) -> list[torch.Tensor]:
    piece = _piece(piece_id)
    return piece.run_compiled(piece.join(tensors, scalars))


@compiled_piece.register_fake
def _(piece_id, tensors, scalars):
    piece = _piece(piece_id)
    return piece.run_fake(piece.join(list(tensors), list(scalars)))
