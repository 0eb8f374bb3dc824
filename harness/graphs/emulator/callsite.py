"""Where in the caller's code a capture went wrong, so an error points at the offending line."""

from __future__ import annotations

import dis
import linecache
import os
import sys
import traceback
from types import FrameType, TracebackType

import torch

_SKIPPED = (os.path.dirname(torch.__file__), os.path.dirname(__file__))


def _is_user_file(filename: str) -> bool:
    return not filename.startswith(_SKIPPED) and not filename.startswith("<frozen")


def _describe(filename: str, lineno: int) -> str:
    source = linecache.getline(filename, lineno).strip()
    where = f"{os.path.relpath(filename) if filename.startswith(os.getcwd()) else filename}:{lineno}"
    return f"{where}: {source}" if source else where


def at_callsite(message: str, where: str) -> str:
    """`message`, followed by where it happened when that is known."""
    return f"{message} (at {where})" if where else message


def _user_frame() -> FrameType | None:
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and not _is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def current_callsite() -> str:
    """The innermost caller frame outside torch and this package, as `file:line: source`."""
    frame = _user_frame()
    return "" if frame is None else _describe(frame.f_code.co_filename, frame.f_lineno)


class LaterCallsite:
    """`current_callsite()` found now and written out only if asked (`str()`): what a tracker
    keeps for every access, most of which no report ever names."""

    __slots__ = ("_filename", "_lineno")

    def __init__(self, frame: FrameType | None) -> None:
        self._filename = "" if frame is None else frame.f_code.co_filename
        self._lineno = 0 if frame is None else frame.f_lineno

    def __str__(self) -> str:
        return _describe(self._filename, self._lineno) if self._filename else ""

    def __bool__(self) -> bool:
        return bool(self._filename)

    def __contains__(self, text: str) -> bool:
        return text in str(self)


def callsite_later() -> LaterCallsite:
    """The innermost caller frame outside torch and this package, written out when needed."""
    return LaterCallsite(_user_frame())


def in_index_assignment() -> bool:
    """Whether the innermost caller frame outside torch is executing `x[...] = value`. A Python
    scalar assigned that way reaches aten as a tensor lifted from host data, like `torch.tensor`."""
    frame = _user_frame()
    return frame is not None and frame.f_code.co_code[frame.f_lasti] == _STORE_SUBSCR


_STORE_SUBSCR = dis.opmap.get("STORE_SUBSCR", -1)  # -1: a Python without it never matches


def traceback_callsite(tb: TracebackType | None) -> str:
    """The innermost frame of a traceback outside torch and this package."""
    found = ""
    for summary in traceback.extract_tb(tb):
        if _is_user_file(summary.filename):
            found = _describe(summary.filename, summary.lineno or 0)
    return found


Frame = tuple[str, int]  # (filename, line)


def user_frames(limit: int = 4, skip: tuple[str, ...] = ()) -> tuple[Frame, ...]:
    """The innermost `limit` caller frames outside torch, this package and the files in `skip`,
    innermost first, kept as (filename, line) so that recording them costs no source lookup."""
    frames: list[Frame] = []
    frame = _user_frame()
    while frame is not None and len(frames) < limit:
        name = frame.f_code.co_filename
        if _is_user_file(name) and name not in skip:
            frames.append((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return tuple(frames)


def describe_frame(frame: Frame) -> str:
    """`file:line: source` of a frame from `user_frames`."""
    return _describe(*frame)
