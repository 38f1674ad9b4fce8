"""The suite is hermetic: what the caller's shell has set, or what else runs on the host, decides no test."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT, Collector, Proc, clean_environ, cli
from tests.services.procs import refused_port, require_binary

# Tests that start collectors, agents, `run` and the CLI as real processes, or read settings in process.
REPRESENTATIVE = [
    "tests/project/test_hermetic.py::test_no_setting_of_the_caller_reaches_a_test_or_its_children",
    "tests/e2e/test_security.py::test_token_required",
    "tests/e2e/test_e2e.py::test_status_of_unknown_job_and_unreachable_collector",
    "tests/e2e/test_e2e.py::test_jobs_lists_the_running_job",
    "tests/cli/test_run_demo.py::test_run_passes_success_through",
    "tests/agent/test_sim_source.py::test_a_real_agent_plays_the_run_it_is_given",
    "tests/common/test_config.py",
]

PRINT_ENV = "import json, os; print(json.dumps(sorted(k for k in os.environ if k.startswith('CLUSTERWATCH_'))))"


def test_no_setting_of_the_caller_reaches_a_test_or_its_children(tmp_path: Path) -> None:
    assert [k for k in os.environ if k.startswith("CLUSTERWATCH_")] == []
    child = Proc([sys.executable, "-c", PRINT_ENV], tmp_path / "child.log")
    assert child.popen.wait(timeout=30) == 0
    assert child.text().strip() == "[]"
    # the CLI as the tests run it: a config file named by the caller would make every command fail
    assert cli("jobs", "--help").returncode == 0


def test_the_tests_pass_with_the_callers_clusterwatch_settings_set() -> None:
    with refused_port() as port:
        hostile = {"CLUSTERWATCH_TOKEN": "x", "CLUSTERWATCH_COLLECTOR": f"127.0.0.1:{port}",
                   "CLUSTERWATCH_DB": "/nonexistent/x", "CLUSTERWATCH_CONFIG": "/nonexistent",
                   "CLUSTERWATCH_SIM_RUN": "the-callers-run", "CLUSTERWATCH_QUERY_AUTH": "munge"}
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *REPRESENTATIVE],
                             env={**os.environ, **hostile}, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "failed" not in out.stdout and "error" not in out.stdout


def test_a_munged_where_the_collector_looks_leaves_the_tests_collectors_open(tmp_path: Path, munged: Path) -> None:
    # A system munged at the collector's socket would, under --query-auth auto, make every query need a
    # credential of that munged; the collectors the tests start answer queries whatever munged runs here.
    collector = Collector(tmp_path, "--munge-socket", str(munged))
    try:
        r = cli("status", "no-such-job", "--collector", collector.address,
                env={"PATH": "/nonexistent"})  # no munge for the CLI: an unauthenticated query
        assert r.returncode == 1 and "unknown" in r.stderr, r.stderr
    finally:
        collector.stop()


SSHD_WITHOUT_PRIVSEP_DIR = """
import os, subprocess
from tests.services.sshd import running_sshd
with running_sshd() as s:
    login = subprocess.run(["ssh", "-i", str(s.client_key), "-o", f"UserKnownHostsFile={s.known_hosts}",
                            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-p", str(s.port),
                            f"{s.username}@127.0.0.1", "echo", "logged-in"], capture_output=True, text=True,
                           timeout=60)
    print(login.stdout.strip() or login.stderr.strip()[-300:])
print(sorted(os.listdir("/run")))
"""


def test_the_sshd_fixture_needs_no_privsep_dir_of_the_host() -> None:
    # A host whose /run has no sshd folder (the init script that makes it never ran): the fixture's sshd
    # starts and takes a login, and nothing is created in /run. Played in a child whose /run is empty.
    require_binary("unshare", "util-linux")
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
                          'mount -n -t tmpfs -o mode=755 cw-test-run /run && exec "$@"', "sh",
                          sys.executable, "-c", SSHD_WITHOUT_PRIVSEP_DIR],
                         cwd=ROOT, env=clean_environ(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert out.stdout.splitlines() == ["logged-in", "[]"], out.stdout + out.stderr[-2000:]
