"""Miniatures of public capture bugs, written against `torch.cuda` as a runtime team writes them.
Each test runs inside the harness's device: the emulated CUDA device on a CPU (the session's under
`--emulate-cuda`, else one per test), the graph sanitizer (`harness.emulate_cuda()` over the real
device) on a GPU. The buggy version must fail with the harness's named error, the fixed one pass.

A session under `--emulate-cuda` runs every test on its device's settings, except two kinds, each
skipped there with its reason (the session on the default settings checks them):
- `explains_against_eager` under `--cuda-schedule adversarial`: `explain_against_eager` observes
  replays only in issue order and refuses that schedule (`ReplaysNotObserved`). The bugs it
  explains are values a graph froze or a layout it kept, not stream ordering.
- `strict_races` under `--cuda-races report` (or `off`): the test needs the race, or the read of
  shared-pool memory another graph overwrote, raised where it happens; `track_stream_races()`
  refuses a mode other than the device's, and report mode warns instead of raising."""

from __future__ import annotations

import pytest

import harness
from harness.emulation import emulation_active
from harness.emulation.session import active_state

EXPLAINS = "explains_against_eager"
STRICT_RACES = "strict_races"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{EXPLAINS}: the test calls harness.check.explain_cuda.explain_against_eager, "
                   f"which needs the issue-order schedule; skipped, with the reason, in a session "
                   f"under --cuda-schedule adversarial")
    config.addinivalue_line(
        "markers", f"{STRICT_RACES}: the test needs races raised (the emulated device's "
                   f"races='strict', the default); skipped, with the reason, in a session under "
                   f"--cuda-races report or off")


@pytest.fixture(autouse=True)
def harness_device(request):
    if emulation_active() is not None:
        _skip_what_the_session_device_cannot_check(request)
        yield
        return
    if "no_device_context" in request.keywords:
        yield
        return
    with harness.emulate_cuda():
        yield


def _skip_what_the_session_device_cannot_check(request) -> None:
    state = active_state()
    schedule = getattr(state, "schedule", "issue_order")
    if schedule != "issue_order" and request.node.get_closest_marker(EXPLAINS) is not None:
        pytest.skip(f"explain_against_eager observes replays only in issue order; this session "
                    f"runs the emulated device under --cuda-schedule {schedule} (ReplaysNotObserved "
                    f"by design). The bug it explains is checked in a session on the default "
                    f"schedule")
    races = getattr(state, "races", "strict")
    if races != "strict" and request.node.get_closest_marker(STRICT_RACES) is not None:
        pytest.skip(f"needs races raised where they happen (races='strict'); this session runs "
                    f"the emulated device under --cuda-races {races}, which does not raise them "
                    f"by design. The bug is checked in a session on the default races setting")
