"""`clusterwatch run` and `demo` stopped by real signals: what kill, timeout, scancel, a dropped SSH session
and Ctrl-C send. Nothing they started may outlive them, their temporary folder goes, and they exit 128+N.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from tests.support.helpers import CLI, clean_environ, cli, left_behind, wait_for

pytestmark = pytest.mark.e2e

# the command's tree: a child in its own session, a double-forked daemon (re-parented away from the
# command), and the command itself sleeping in the foreground
FAMILY = textwrap.dedent("""
    import os, subprocess, sys, time
    subprocess.Popen(["sleep", "300"], start_new_session=True)
    if os.fork() == 0:
        if os.fork() == 0:
            time.sleep(300)
        os._exit(0)
    print("family ready", flush=True)
    time.sleep(300)
""")

IGNORES_SIGINT = textwrap.dedent("""
    import signal, subprocess, time
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    subprocess.Popen(["sleep", "300"])  # inherits the ignored SIGINT too
    print("family ready", flush=True)
    time.sleep(300)
""")


class Session:
    """One `clusterwatch …` process started the way a shell would, its output in files, its children marked."""

    def __init__(self, tmp: Path, *args: str) -> None:
        self.marker = uuid.uuid4().hex
        self.tmpdir = tmp / "tmp"
        self.tmpdir.mkdir()
        env = dict(clean_environ(), CW_SIGNAL_TEST=self.marker, TMPDIR=str(self.tmpdir))
        self.out_path, self.err_path = tmp / "out", tmp / "err"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            # its own process group, as a shell puts a job: a group signal reaches it and its command only
            self.proc = subprocess.Popen([*CLI, *args], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         env=env, cwd=tmp, start_new_session=True)

    def out(self) -> str:
        return self.out_path.read_text(errors="replace")

    def err(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_for_processes(self, at_least: int) -> None:
        wait_for(lambda: len(left_behind("CW_SIGNAL_TEST", self.marker)) >= at_least or self.proc.poll() is not None,
                 timeout=60, what=f"{at_least} processes")
        assert self.proc.poll() is None, self.err()

    def left(self) -> list[int]:
        return [p for p in left_behind("CW_SIGNAL_TEST", self.marker) if p != self.proc.pid]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in left_behind("CW_SIGNAL_TEST", self.marker):  # a failed test still cleans up
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def session(tmp_path):
    made = []

    def start(*args: str) -> Session:
        made.append(Session(tmp_path, *args))
        return made[-1]

    yield start
    for s in made:
        s.close()


def _run_family(session, tmp_path: Path, script: str) -> Session:
    (tmp_path / "family.py").write_text(script)
    s = session("run", "--interval", "0.5", "--gpu-source", "none", "--status-every", "0", "--",
                "python3", str(tmp_path / "family.py"))
    wait_for(lambda: "family ready" in s.out() or s.proc.poll() is not None, timeout=60, what="the command")
    # collector, agent, the command, its session child and its daemon
    s.wait_for_processes(5)
    # and the collector has the job's first samples, so there is a report to print
    job, address = re.search(r"watching (local-\d+) .*collector on (\S+)", s.err()).groups()
    wait_for(lambda: cli("status", job, "--collector", address).returncode == 0, timeout=30,
             what="the job's first samples")
    return s


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_run_stopped_by_a_signal_stops_everything_prints_the_report_and_exits_128_plus_n(session, tmp_path, sig):
    s = _run_family(session, tmp_path, FAMILY)
    assert os.listdir(s.tmpdir), "run keeps its store in a temporary folder"
    s.proc.send_signal(sig)
    assert s.proc.wait(60) == 128 + sig, s.err()
    assert s.left() == [], "the command's tree, the collector or the agent outlived run"
    assert os.listdir(s.tmpdir) == [], "the temporary folder stays"
    err = s.err()
    assert f"{signal.Signals(sig).name}: passed to the command" in err
    assert "clusterwatch · job local-" in err  # the report
    assert f"exit code {128 + sig}" in err


def test_run_ctrl_c_twice_stops_a_command_that_ignores_sigint(session, tmp_path):
    s = _run_family(session, tmp_path, IGNORES_SIGINT)
    os.killpg(s.proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
    # run has handled the first Ctrl-C (it says so), then still waits a while for the command
    wait_for(lambda: "Ctrl-C again stops it" in s.err(), timeout=30, what="run's answer to the first Ctrl-C")
    time.sleep(2)
    assert s.proc.poll() is None, "the command ignores SIGINT: run waits for it"
    os.killpg(s.proc.pid, signal.SIGINT)
    assert s.proc.wait(60) == 130, s.err()
    # what stopped it was the second Ctrl-C, not a slow end to the first
    assert "SIGTERM to the command's" in s.err(), s.err()
    assert s.left() == []
    assert "clusterwatch · job local-" in s.err()


def test_run_passes_a_sigint_sent_to_it_alone_to_the_command(session, tmp_path):
    s = _run_family(session, tmp_path, FAMILY)
    s.proc.send_signal(signal.SIGINT)  # `kill -INT PID`: the command did not get it from a terminal
    assert s.proc.wait(60) == 130, s.err()
    assert s.left() == []
    assert os.listdir(s.tmpdir) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_demo_stopped_by_a_signal_leaves_nothing_and_exits_128_plus_n(session, sig):
    s = session("demo", "--duration", "120", "--interval", "0.5")
    s.wait_for_processes(7)  # the collector, two agents, four ranks
    time.sleep(1)
    s.proc.send_signal(sig)
    assert s.proc.wait(60) == 128 + sig, s.err()
    assert s.left() == []
    assert os.listdir(s.tmpdir) == []
    assert f"Interrupted ({signal.Signals(sig).name})" in s.err()
