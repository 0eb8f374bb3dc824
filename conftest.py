"""Root conftest: every module in fixtures/ is a plugin, so a new fixture module needs no wiring."""

from pathlib import Path

pytest_plugins = sorted(
    f"fixtures.{path.stem}"
    for path in (Path(__file__).parent / "fixtures").glob("*.py")
    if path.stem != "__init__"
)
