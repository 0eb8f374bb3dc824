"""Where in the caller's code a capture went wrong, so an error points at the offending line.

The one lookup of a call site for the emulator, the capture lint and the audit: the innermost frame
outside torch and the emulator (and outside any `also_skip` folder or file), or of a traceback, the
innermost frame in the files a caller asks for, each as `file:line: source`.
"""

from __future__ import annotations

import dis
import functools
import importlib.util
import linecache
import os
import sys
from types import FrameType, TracebackType
from typing import Any, Callable

import torch

from harness.graphs.emulator import fx_lines

_HARNESS_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The graph backends and the emulated device are machinery: an error names the line that called them.
MACHINERY_DIRS = (os.path.join(_HARNESS_DIR, "graphs") + os.sep, os.path.join(_HARNESS_DIR, "emulation") + os.sep)


def _package_dirs(name: str) -> tuple[str, ...]:
    """Where an installed package's modules live (none where it is not installed)."""
    spec = importlib.util.find_spec(name)
    return tuple(os.path.join(d, "") for d in (spec.submodule_search_locations or ())) if spec else ()


# Triton's launcher (`kernel[grid](...)` goes through triton's JIT module) is machinery too: a
# Triton launch on the emulated device names the line that launched the kernel.
_SKIPPED = (os.path.dirname(torch.__file__),) + MACHINERY_DIRS + _package_dirs("triton")
# A module outside these folders that runs inside the program's ops (the explainer's op log, a
# dispatch mode of its own) sets `__harness_machinery__ = True`: its frames are skipped too, so
# an error raised under it names the program's line, not the module's.
MACHINERY_MARK = "__harness_machinery__"


@functools.lru_cache(maxsize=4096)
def _is_user_file(filename: str, also_skip: tuple[str, ...] = ()) -> bool:
    # Cached: every tracked op walks its caller frames through here, a few files over and over.
    return not filename.startswith(_SKIPPED + also_skip) and not filename.startswith("<frozen")


def _is_user_frame(frame: FrameType, also_skip: tuple[str, ...] = ()) -> bool:
    return _is_user_file(frame.f_code.co_filename, also_skip) and frame.f_globals.get(MACHINERY_MARK) is not True


def describe_line(filename: str, lineno: int) -> str:
    """`file:line: source`; a file in site-packages named from there on (the same on every machine),
    one under the working directory relative to it."""
    source = linecache.getline(filename, lineno).strip()
    short = filename.split(f"site-packages{os.sep}")[-1]
    if short == filename and filename.startswith(os.getcwd() + os.sep):
        short = os.path.relpath(filename)
    return fx_lines.describe(filename, f"{short}:{lineno}: {source}" if source else f"{short}:{lineno}")


def at_callsite(message: str, where: str) -> str:
    """`message`, followed by where it happened when that is known."""
    return f"{message} (at {where})" if where else message


# Whether each code object met is the caller's (no `also_skip`), by the code object's id: the stream tracking walks about
# ten frames for every op it sees, the same few dozen code objects over and over. A code object
# keeps its module, so its answer stays; the cache is cleared when it grows past its bound
# (generated code, FX's, can make code objects without end).
_USER_CODE: dict = {}  # id -> code object, for the caller's code
_MACHINERY_CODE: dict = {}  # and for torch's, the emulator's and other skipped code
_USER_CODE_BOUND = 4096


def _user_frame(also_skip: tuple[str, ...] = ()) -> FrameType | None:
    frame: FrameType | None = sys._getframe(2)
    if also_skip:
        while frame is not None and not _is_user_frame(frame, also_skip):
            frame = frame.f_back
        return frame
    machinery, users = _MACHINERY_CODE, _USER_CODE
    while frame is not None:
        code = frame.f_code
        # by id: a code object hashes its constants each time; kept, so its id stays its own
        if machinery.get(id(code)) is code:
            frame = frame.f_back
            continue
        if users.get(id(code)) is code:
            return frame
        if len(machinery) + len(users) >= _USER_CODE_BOUND:
            machinery.clear()
            users.clear()
        if _is_user_frame(frame):
            users[id(code)] = code
            return frame
        machinery[id(code)] = code
        frame = frame.f_back
    return frame


def current_callsite(also_skip: tuple[str, ...] = ()) -> str:
    """The innermost caller frame outside torch, the emulator and `also_skip`, as `file:line: source`
    (for FX-generated code, the model line its node was traced from, fx_lines.py; a graph dynamo
    compiled from torch's own code is torch's, and the caller's line outside it is named)."""
    frame = _user_frame(also_skip)
    while frame is not None and _torchs_own_graph(frame):
        frame = frame.f_back
        while frame is not None and not _is_user_frame(frame, also_skip):
            frame = frame.f_back
    if frame is None:
        return ""
    return describe_frame(_source_frames(frame)[0])


# Torch's higher-order operators compile their own eager path (torch.cond's `_cond_op_wrapper`,
# compiled at each eager call): a graph of torch's code, whose nodes carry no model line.
_TORCHS_COMPILED_CODE = os.path.join(os.path.dirname(torch.__file__), "_higher_order_ops", "")


def _torchs_own_graph(frame: FrameType) -> bool:
    """Whether `frame` runs FX-generated code without a model line that torch's own code (not
    the caller's) compiled and called: the first frame outside it that is the caller's or a
    higher-order operator's says which."""
    if not fx_lines.is_generated(frame.f_code.co_filename) or any(
            _is_user_file(name) for name, _ in fx_lines.source_frames(frame)):
        return False
    outer = frame.f_back
    while outer is not None:
        name = outer.f_code.co_filename
        if name.startswith(_TORCHS_COMPILED_CODE):
            return True
        if _is_user_frame(outer):
            return False
        outer = outer.f_back
    return False


class LaterCallsite:
    """The innermost caller frame found now and written out only if asked (`str()`, once): what a
    tracker keeps for every access, most of which no report ever names. With `resolve_generated`
    a frame of FX-generated code is resolved to its node's model line now, while the frame is live
    (what `current_callsite()` names); without, it names the generated line, which costs nothing
    more on the tracking's hot path. The frame's code and instruction offset are kept, not its
    line: `f_lineno` scans the code's line table from its start at every ask (1.5 us for a
    decode step's frame), `f_lasti` is a field; the line is looked up when written out."""

    __slots__ = ("_filename", "_code", "_lasti", "_lineno", "_text")

    def __init__(self, frame: FrameType | None, *, resolve_generated: bool = False) -> None:
        self._text: str | None = None
        self._code = None
        if frame is None:
            self._filename, self._lineno = "", 0
        elif resolve_generated and fx_lines.is_generated(frame.f_code.co_filename):
            self._filename, self._lineno = _source_frames(frame)[0]
        else:
            code = frame.f_code
            self._filename, self._code, self._lasti = code.co_filename, code, frame.f_lasti

    def __str__(self) -> str:
        if self._text is None:
            if self._code is not None:
                self._lineno, self._code = _line_at(self._code, self._lasti), None
            self._text = describe_line(self._filename, self._lineno) if self._filename else ""
        return self._text

    def __bool__(self) -> bool:
        return bool(self._filename)

    def __contains__(self, text: str) -> bool:
        return text in str(self)


def _line_at(code: Any, offset: int) -> int | None:
    """The source line of the instruction at byte `offset` of `code`: what a frame stopped there
    answers for `f_lineno` (None where no line covers it)."""
    for start, end, line in code.co_lines():
        if start <= offset < end:
            return line
    return None


def callsite_later(*, resolve_generated: bool = False) -> LaterCallsite:
    """The innermost caller frame outside torch and this package, written out when needed;
    `resolve_generated`: an FX-generated frame as its model line, as `current_callsite()` has it."""
    return LaterCallsite(_user_frame(), resolve_generated=resolve_generated)


def in_index_assignment() -> bool:
    """Whether the innermost caller frame outside torch is executing `x[...] = value`. A Python
    scalar assigned that way reaches aten as a tensor lifted from host data, like `torch.tensor`."""
    frame = _user_frame()
    return frame is not None and frame.f_code.co_code[frame.f_lasti] == _STORE_SUBSCR


_STORE_SUBSCR = dis.opmap.get("STORE_SUBSCR", -1)  # -1: a Python without it never matches


def traceback_callsite(tb: TracebackType | None, *, also_skip: tuple[str, ...] = (),
                       in_file: Callable[[str], bool] | None = None) -> str:
    """The innermost frame of a traceback outside torch, the emulator and `also_skip`, or (with
    `in_file`) the innermost frame whose file it accepts."""
    found = ""
    while tb is not None:
        frame = tb.tb_frame
        if in_file(frame.f_code.co_filename) if in_file is not None else _is_user_frame(frame, also_skip):
            found = describe_line(frame.f_code.co_filename, tb.tb_lineno or 0)
        tb = tb.tb_next
    return found


Frame = tuple[str, int]  # (filename, line)


def user_frames(limit: int = 4, skip: tuple[str, ...] = ()) -> tuple[Frame, ...]:
    """The innermost `limit` caller frames outside torch, this package and the files in `skip`,
    innermost first, kept as (filename, line) so that recording them costs no source lookup. A frame
    of FX-generated code stands for the model frames its node was traced from (fx_lines.py)."""
    frames: list[Frame] = []
    frame = _user_frame()
    while frame is not None and len(frames) < limit:
        name = frame.f_code.co_filename
        if _is_user_frame(frame) and name not in skip:
            frames.extend(_source_frames(frame))
        frame = frame.f_back
    return tuple(frames[:limit])


def _source_frames(frame: FrameType) -> tuple[Frame, ...]:
    """The frame as (filename, line), or for FX-generated code its node's model frames, if traced."""
    name = frame.f_code.co_filename
    if fx_lines.is_generated(name):
        # Dynamo traced through torch and through the emulated device's modes too: their frames
        # are in the node's stack, and are not the model's.
        traced = tuple(f for f in fx_lines.source_frames(frame) if _is_user_file(f[0]))
        if traced:
            return traced
    return ((name, frame.f_lineno),)


def describe_frame(frame: Frame) -> str:
    """`file:line: source` of a frame from `user_frames`."""
    return describe_line(*frame)
