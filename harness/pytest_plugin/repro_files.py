"""Reproduction files of failing tests in harness sessions (`--repro-dir`), and the
`repro_scenario` fixture a test uses to put its engine-level comparison into its file."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.pytest_plugin.options import DEFAULT_REPRO_DIR


class ScenarioSlot:
    """What `repro_scenario` gives a test: `record(Scenario(...))` puts the engine-level comparison
    the test runs into its reproduction file, so `harness repro` can replay it without pytest."""

    def __init__(self) -> None:
        self.scenario = None

    def record(self, scenario) -> None:
        self.scenario = scenario


@pytest.fixture
def repro_scenario() -> ScenarioSlot:
    return ScenarioSlot()


def folder(config: pytest.Config) -> str:
    return config.getoption("repro_dir") or DEFAULT_REPRO_DIR


def attach(item: pytest.Item, report: pytest.TestReport, *, pytest_options: list[str],
           fault: str | None) -> None:
    """Write the file of a failed test and name it in the report (its section and JUnit property,
    so `harness run` can list the files)."""
    path = write_repro_file(item, report, item.config.rootpath / folder(item.config),
                            pytest_options=pytest_options, fault=fault)
    slot = getattr(item, "funcargs", {}).get("repro_scenario")
    explain = f"\nharness explain {path}" if getattr(slot, "scenario", None) is not None else ""
    report.sections.append(("reproduction", f"harness repro {path}{explain}"))
    item.user_properties.append(("reproduction", str(path)))


def write_repro_file(item: pytest.Item, report: pytest.TestReport, folder: Path, *,
                     pytest_options: list[str], fault: str | None) -> Path:
    import torch

    from harness.graphs import resolve_backend
    from harness.repro import ReproRecord, hypothesis_example, write_record

    config = item.config
    backend = resolve_backend(config.getoption("graph_backend"))
    options = [f"--graph-backend={backend}", *pytest_options]
    profile = config.getoption("hypothesis_profile", default=None)
    seed = config.getoption("hypothesis_seed", default=None)
    if profile:
        options += ["--hypothesis-profile", profile]
    if seed is not None:
        options += ["--hypothesis-seed", str(seed)]
    slot = getattr(item, "funcargs", {}).get("repro_scenario")
    text = report.longreprtext
    errors = [line for line in text.splitlines() if line.startswith("E ")]
    record = ReproRecord(
        node_id=item.nodeid, root=str(config.rootpath), backend=backend, torch=torch.__version__,
        pytest_options=tuple(options),
        seeds={"hypothesis_seed": seed, "torch_initial_seed": torch.initial_seed()},
        hypothesis_example=hypothesis_example(text), fault=fault,
        scenario=slot.scenario if isinstance(slot, ScenarioSlot) else None,
        failure="\n".join(errors[:40]) or "\n".join(text.splitlines()[-40:]))
    return write_record(record, folder)
