"""The harness's Hypothesis profiles (ci, nightly, repro) and which one a session loads."""

from __future__ import annotations

import contextlib

import pytest

PROFILES = ("ci", "nightly", "repro")


def _register(names, *, keep_existing: bool) -> None:
    from hypothesis import HealthCheck, settings
    from hypothesis.errors import InvalidArgument

    profiles = {
        # Pre-merge runs must be reproducible and bounded: a red CI run reruns red.
        "ci": dict(derandomize=True, max_examples=25, deadline=None, database=None,
                   suppress_health_check=[HealthCheck.too_slow]),
        "nightly": dict(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow]),
        "repro": dict(derandomize=True, print_blob=True, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow]),
    }
    for name in names:
        if keep_existing:
            with contextlib.suppress(InvalidArgument):
                settings.get_profile(name)
                continue
        settings.register_profile(name, **profiles[name])


def configure(config: pytest.Config, *, in_use: bool) -> None:
    """Before Hypothesis' own plugin loads --hypothesis-profile (that profile must exist by then)."""
    profile = config.getoption("hypothesis_profile", default=None)
    if in_use:
        _register(PROFILES, keep_existing=False)
        from hypothesis import settings

        # Hypothesis itself loads its own `ci` profile where it detects CI; a profile the project
        # loaded itself under another name is kept.
        if not profile and settings.get_current_profile_name() in ("default", "ci"):
            settings.load_profile("ci")
    elif profile in PROFILES:
        # Not a harness session: a profile of that name the project registered itself wins.
        _register([profile], keep_existing=True)
