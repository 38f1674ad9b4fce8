"""Pytest fixtures for the stand-in: import them into a test module (`from ... import stub_lib`)."""
from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.nvml_stub import build


@pytest.fixture(scope="session")
def stub_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in built with the system C compiler (a driver of R510 or later)."""
    return build(tmp_path_factory.mktemp("nvml-stub"))


@pytest.fixture(scope="session")
def stub_lib_no_v3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in without the `_v3` process functions: a driver older than R510."""
    return build(tmp_path_factory.mktemp("nvml-stub-no-v3"), v3=False)


@contextlib.contextmanager
def sleeping_pids(count: int) -> Iterator[list[int]]:
    """The pids of `count` live processes of this host, killed at the end (NVML names host pids; the source
    drops any other)."""
    procs = [subprocess.Popen(["sleep", "300"]) for _ in range(count)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.fixture
def live_pids() -> Iterator[list[int]]:
    """Eight live processes of this host."""
    with sleeping_pids(8) as pids:
        yield pids
