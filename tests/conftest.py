"""Shared pytest fixtures. Service fixtures (Slurm, sshd) live in tests/services/ and load as plugins, as do
the real git repositories of the provenance tests (tests/support/git_repos.py)."""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator

import pytest

from clusterwatch.grpc_fork import fork_handlers_off
from tests.support.hermetic import SUITE_SETTINGS, callers_settings

# As the console script does (clusterwatch/grpc_fork.py): the suite runs gRPC servers and channels in its
# own process and forks git and py-spy beside them, which gRPC's fork handlers could crash before the exec.
fork_handlers_off()

pytest_plugins = ["tests.services.slurm", "tests.services.sshd", "tests.services.prometheus", "tests.services.munge",
                  "tests.support.git_repos"]


#: What a runner started in the background ignores (`cmd &` in a script: SIGINT, SIGQUIT; nohup: SIGHUP).
_STOP_SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)


def _ignore(signum, frame) -> None:
    """Ignores a signal as SIG_IGN did, but, being a handler, is reset to the default across exec."""


def pytest_configure(config: pytest.Config) -> None:
    """An ignored signal is inherited across exec: under `bash scripts/test.sh &` every process a test starts
    ignored SIGINT, and the tests that stop `status --watch` or `run` with it waited on it for ever. The
    runner goes on ignoring them (a handler that does nothing); the children start with the default."""
    for sig in _STOP_SIGNALS:
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, _ignore)
    _hypothesis_home(config)


def _hypothesis_home(config: pytest.Config) -> None:
    """Hypothesis keeps its example database and caches in `.hypothesis/` under the working directory (the
    checkout): here they go into pytest's cache (kept between runs, so a failing example is tried first next
    time), or a temporary folder under `-p no:cacheprovider`. Its home, not a profile's `database`: the
    database setting moves the examples alone, not its other caches."""
    from hypothesis.configuration import set_hypothesis_home_dir

    cache = getattr(config, "cache", None)
    if cache is not None:
        set_hypothesis_home_dir(cache.mkdir("hypothesis"))
    else:
        home = tempfile.mkdtemp(prefix="hypothesis-")
        config.add_cleanup(lambda: shutil.rmtree(home, ignore_errors=True))
        set_hypothesis_home_dir(home)


def _suite_settings(patch: pytest.MonkeyPatch) -> None:
    for name in callers_settings(os.environ):
        patch.delenv(name)
    for name, value in SUITE_SETTINGS.items():
        patch.setenv(name, value)


@pytest.fixture(scope="session", autouse=True)
def _hermetic_session() -> Iterator[None]:
    """The caller's CLUSTERWATCH_* settings (a token, a collector, a store, a config file) and proxies reach
    neither the code under test in this process nor the children it starts from os.environ, and neither does
    the site config or the host's kernel log (tests/support/hermetic.py); session-wide, so the session's own services
    (Slurm, munged, Prometheus) start that way too. Restored at the end."""
    with pytest.MonkeyPatch.context() as patch:
        _suite_settings(patch)
        yield


@pytest.fixture(autouse=True)
def _hermetic_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with the suite's settings alone, whatever an earlier test left set."""
    _suite_settings(monkeypatch)
