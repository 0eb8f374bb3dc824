"""Under `harness run`, each pytest process writes one part of the run's JUnit XML and the run
prints the merged file; pytest's own "generated xml file: <part>" line would name a second path.
Once the part is written, its writer is taken out of the session, so its summary line is not
printed (the file is already complete), and put back before pytest's JUnit plugin unconfigures
(it unregisters its writer itself)."""

from __future__ import annotations

import os

import pytest

_set_aside = pytest.StashKey[list]()


def silence(config: pytest.Config) -> int:
    """Unregister the JUnit writer of `config`'s --junitxml file; how many were unregistered."""
    path = getattr(config.option, "xmlpath", None)
    if not path:
        return 0
    target = os.path.normpath(os.path.abspath(os.path.expanduser(os.path.expandvars(path))))
    writers = [plugin for plugin in config.pluginmanager.get_plugins()
               if getattr(plugin, "logfile", None) == target and hasattr(plugin, "pytest_terminal_summary")]
    for writer in writers:
        config.pluginmanager.unregister(writer)
    config.stash[_set_aside] = writers
    return len(writers)


def restore(config: pytest.Config) -> None:
    for writer in config.stash.get(_set_aside, []):
        config.pluginmanager.register(writer)
    config.stash[_set_aside] = []
