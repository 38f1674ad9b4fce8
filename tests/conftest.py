"""Shared pytest fixtures. Service fixtures (Slurm, sshd) live in tests/services/ and load as plugins, as do
the real git repositories of the provenance tests (tests/git_repos.py)."""
from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

pytest_plugins = ["tests.services.slurm", "tests.services.sshd", "tests.services.prometheus", "tests.services.munge",
                  "tests.git_repos"]


def _drop_clusterwatch_settings(patch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("CLUSTERWATCH_")]:
        patch.delenv(name)


@pytest.fixture(scope="session", autouse=True)
def _hermetic_session() -> Iterator[None]:
    """The caller's CLUSTERWATCH_* settings (a token, a collector, a store, a config file) reach neither the
    code under test in this process nor the children it starts from os.environ; session-wide, so the
    session's own services (Slurm, munged, Prometheus) start without them too. Restored at the end."""
    with pytest.MonkeyPatch.context() as patch:
        _drop_clusterwatch_settings(patch)
        yield


@pytest.fixture(autouse=True)
def _hermetic_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts without CLUSTERWATCH_* settings, whatever an earlier test left set."""
    _drop_clusterwatch_settings(monkeypatch)
