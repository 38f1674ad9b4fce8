"""Parsing traps: what a user types means what it says, or is one clear error (real processes)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.support.helpers import CLI, clean_environ, cli

from .test_cli_streams import running_job  # noqa: F401  (a fixture: a real run's job and collector)

pytestmark = pytest.mark.e2e


def test_an_unknown_key_in_the_config_file_is_an_error(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[cli]\ncolector = "127.0.0.1:1"\n')
    r = cli("--config", str(bad), "status", "42")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "[cli] has no setting colector" in r.stderr
    good = tmp_path / "good.toml"
    good.write_text('[cli]\ncollector = "127.0.0.1:1"\n')
    r = cli("--config", str(good), "status", "42")
    assert r.returncode == 1 and "the collector at 127.0.0.1:1 does not answer" in r.stderr


def test_record_to_stdout_and_never_over_a_file_unasked(tmp_path, running_job):  # noqa: F811
    job, address = running_job
    r = subprocess.run([*CLI, "record", job, "--collector", address, "-o", "-"], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path, env=clean_environ())
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "-").exists()
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert lines and "wrote" in r.stderr and "to stdout" in r.stderr
    kept = tmp_path / "kept.jsonl"
    kept.write_text("precious\n")
    r = cli("record", job, "--collector", address, "-o", str(kept))
    assert r.returncode == 2 and "exists; pass --force" in r.stderr
    assert kept.read_text() == "precious\n"
    r = cli("record", job, "--collector", address, "-o", str(kept), "--force")
    assert r.returncode == 0, r.stderr
    assert kept.read_text() != "precious\n"
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".part")]


def test_alerts_for_a_job_the_collector_does_not_know(running_job):  # noqa: F811
    job, address = running_job
    r = cli("alerts", "--job", "nosuch", "--collector", address)
    assert r.returncode == 1 and "nosuch" in r.stderr and "unknown" in r.stderr
    r = cli("alerts", "--job", job, "--collector", address)
    assert r.returncode == 0 and r.stdout == "no alerts\n", r.stderr
