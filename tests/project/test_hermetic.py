"""The suite is hermetic: what the caller's shell has set, or what else runs on the host, decides no test."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.services.procs import refused_port, require_binary
from tests.support.helpers import CLI, ROOT, Collector, Proc, clean_environ, cli, wait_for
from tests.support.hermetic import PROXY_VARIABLES, SUITE_SETTINGS

# Tests that start collectors, agents, `run` and the CLI as real processes, or read settings in process.
REPRESENTATIVE = [
    "tests/project/test_hermetic.py::test_no_setting_of_the_caller_reaches_a_test_or_its_children",
    "tests/project/test_hermetic.py::test_an_agent_the_tests_start_reads_no_kernel_log",
    "tests/e2e/test_security.py::test_token_required",
    "tests/e2e/test_e2e.py::test_status_of_unknown_job_and_unreachable_collector",
    "tests/e2e/test_e2e.py::test_jobs_lists_the_running_job",
    "tests/e2e/test_shard_refuses.py",  # /metrics read over HTTP (urllib takes http_proxy), a sharded list
    "tests/cli/test_run_demo.py::test_run_passes_success_through",
    "tests/agent/test_sim_source.py::test_a_real_agent_plays_the_run_it_is_given",
    "tests/common/test_config.py",
]

PRINT_ENV = "import json, os; print(json.dumps(sorted(k for k in os.environ if k.startswith('CLUSTERWATCH_'))))"

# A site's config as /etc/clusterwatch/config.toml, ~/.config and $XDG_CONFIG_HOME might hold it: every
# command's collector an address nobody answers on, a token, a rules file that does not exist, slow polls.
SITE_CONFIG = """
collectors = ["127.0.0.1:{port}"]
[agent]
token = "the-sites-token"
interval = 60
kmsg = "/dev/kmsg"
[collector]
token = "the-sites-token"
rules_path = "/nonexistent/rules.toml"
query_auth = "munge"
[cli]
collector = "127.0.0.1:{port}"
"""


def test_no_setting_of_the_caller_reaches_a_test_or_its_children(tmp_path: Path) -> None:
    ours = sorted(SUITE_SETTINGS)
    assert sorted(k for k in os.environ if k.startswith("CLUSTERWATCH_")) == ours
    assert [k for k in os.environ if k in PROXY_VARIABLES] == []
    child = Proc([sys.executable, "-c", PRINT_ENV], tmp_path / "child.log")
    assert child.popen.wait(timeout=30) == 0
    assert json.loads(child.text()) == ours
    # the CLI as the tests run it: a config file named by the caller would make every command fail
    assert cli("jobs", "--help").returncode == 0


def test_an_agent_the_tests_start_reads_no_kernel_log(tmp_path: Path) -> None:
    # An agent reads /dev/kmsg unless told otherwise: on a host whose kernel log holds the driver's XID lines
    # the tests' agents would report them. One started as the tests start agents has no kernel log open.
    with refused_port() as port:
        agent = Proc([*CLI, "agent", "--collector", f"127.0.0.1:{port}", "--node", "hermetic", "--gpu-source", "sim",
                      "--interval", "0.5", "--no-provenance", "--spool-dir", str(tmp_path / "spool"),
                      "--train-socket", str(tmp_path / "t.sock")], tmp_path / "agent.log")
        try:
            wait_for(lambda: "polling every" in agent.text(), timeout=30, what="the agent started")
            time.sleep(1.0)  # its threads are up: the health monitor opens the kernel log as it starts
            opened = []
            for fd in os.listdir(f"/proc/{agent.pid}/fd"):
                try:
                    opened.append(os.readlink(f"/proc/{agent.pid}/fd/{fd}"))
                except OSError:
                    continue
            assert "/dev/kmsg" not in opened, opened
        finally:
            agent.stop()


def _hostile_environment(tmp_path: Path, port: int) -> tuple[dict[str, str], Path]:
    """The caller's environment at its worst, and an overlay's upper folder giving /etc a site config."""
    config = SITE_CONFIG.format(port=port)
    home = tmp_path / "home"
    for folder in (home / ".config" / "clusterwatch", tmp_path / "xdg" / "clusterwatch"):
        folder.mkdir(parents=True)
        (folder / "config.toml").write_text(config)
    etc = tmp_path / "etc-upper"
    (etc / "clusterwatch").mkdir(parents=True)
    (etc / "clusterwatch" / "config.toml").write_text(config)
    proxy = f"http://127.0.0.1:{port}"
    env = {**os.environ, **{name: proxy for name in PROXY_VARIABLES if "no_proxy" not in name.lower()},
           "HOME": str(home), "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "XDG_STATE_HOME": str(tmp_path / "state"),
           "CLUSTERWATCH_TOKEN": "x", "CLUSTERWATCH_COLLECTOR": f"127.0.0.1:{port}",
           "CLUSTERWATCH_DB": "/nonexistent/x",
           "CLUSTERWATCH_CONFIG": "/nonexistent", "CLUSTERWATCH_SIM_RUN": "the-callers-run",
           "CLUSTERWATCH_QUERY_AUTH": "munge", "CLUSTERWATCH_KMSG": "/dev/kmsg", "CLUSTERWATCH_INTERVAL": "60"}
    env.pop("no_proxy", None)
    env.pop("NO_PROXY", None)
    return env, etc


def test_the_tests_pass_in_a_hostile_environment(tmp_path: Path) -> None:
    # Proxies at a port that refuses, the caller's CLUSTERWATCH_* settings, a site config in /etc, ~/.config and
    # $XDG_CONFIG_HOME. /etc/clusterwatch/config.toml is given to the child alone: in a mount namespace of its
    # own, /etc is an overlay of the host's with that file added (the host's /etc is never written).
    require_binary("unshare", "util-linux")
    site_folder_before = os.path.exists("/etc/clusterwatch")
    with refused_port() as port:
        env, etc = _hostile_environment(tmp_path, port)
        work = tmp_path / "overlay-work"
        work.mkdir()
        out = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
             f'mount -n -t overlay cw-test-etc -o "lowerdir=/etc,upperdir={etc},workdir={work}" /etc'
             ' && test -s /etc/clusterwatch/config.toml && exec "$@"', "sh",
             sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *REPRESENTATIVE],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "failed" not in out.stdout and "error" not in out.stdout
    assert os.path.exists("/etc/clusterwatch") == site_folder_before  # the host's /etc as it was


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
