"""Faults planted in what the reference runtime hands out of its graphs (harness.runtime.decode.serving)."""

from __future__ import annotations

import contextlib
from typing import Iterator

from harness.faults.patching import replace_function
from harness.faults.registry import Fault, FaultHandle
from harness.runtime.decode import serving


@contextlib.contextmanager
def graph_output_held(handle: FaultHandle) -> Iterator[None]:
    def make(copy_out):
        def planted(static_output):
            handle.fire()
            return static_output  # a view of the graph's output: the next replay rewrites it
        return planted

    with replace_function(serving, "copy_out", make):
        yield


RUNTIME_FAULTS = (
    Fault(
        name="graph-output-held-across-replays",
        bug_class="a replay's static output is handed out and held across the next replay, which "
                  "overwrites it under the holder",
        link="https://github.com/pytorch/pytorch/issues/148439",
        detector="suites/model/test_capturable.py::test_forward_results_survive_later_replays",
        expected=r"changed under the holder after later replays",
        plant=graph_output_held,
    ),
)
