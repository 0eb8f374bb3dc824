"""Reproduction (docs/user-guide.md, "Reproduction files"): a failing suite test writes `repro/<test id>.json`;
`harness repro FILE` replays it standalone and exits 1 while it still fails."""

from harness.repro.record import ReproRecord, file_name, hypothesis_example, load_record, write_record
from harness.repro.replay import replay
from harness.repro.scenario import ReplayResult, Scenario, run_scenario

__all__ = ["ReplayResult", "ReproRecord", "Scenario", "file_name",
           "hypothesis_example", "load_record", "replay", "run_scenario", "write_record"]
