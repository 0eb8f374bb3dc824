"""A call site taken now and written out later (callsite.LaterCallsite) names the line its frame
was at when it was taken, however far the frame ran since: it keeps the frame's code and
instruction offset, not the frame."""

from __future__ import annotations

import sys

from harness.graphs.emulator.callsite import LaterCallsite


def _taken_here() -> LaterCallsite:
    return LaterCallsite(sys._getframe(1))


def test_a_later_callsite_names_the_line_its_frame_was_at_when_taken():
    sites = []
    for step in range(3):
        sites.append(_taken_here())  # the loop's first line
        total = sum(
            range(step))  # a statement over two lines between
        sites.append(_taken_here() if total >= 0 else None)  # the loop's last line
    first = _taken_here()
    texts = [str(site) for site in (*sites, first)]
    assert all("sites.append(_taken_here())  # the loop's first line" in t for t in texts[0:6:2])
    assert all("sites.append(_taken_here() if total" in t for t in texts[1:6:2])
    assert "first = _taken_here()" in texts[-1]
    assert all("test_callsite.py:" in t for t in texts)


def test_a_later_callsite_of_no_frame_is_empty():
    site = LaterCallsite(None)
    assert str(site) == "" and not site
