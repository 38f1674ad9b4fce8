"""`clusterwatch run` and `clusterwatch demo` as a user runs them: real processes, loopback only."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.helpers import CLI, ROOT, clean_environ, cli, wait_for

pytestmark = pytest.mark.e2e


def _descendants(pid: int) -> set[int]:
    """Every live process below pid (children found through /proc/*/stat)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    text = f.read()
            except OSError:
                continue
            fields = text[text.rindex(b")") + 2:].split()
            if fields[0] != b"Z":
                children.setdefault(int(fields[1]), []).append(int(name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return False
    return text[text.rindex(b")") + 2:].split()[0] != b"Z"


def _sections(report: str) -> list[str]:
    """The section titles of a report: each line above a rule of ─."""
    lines = report.splitlines()
    return [lines[i - 1].strip() for i in range(1, len(lines)) if lines[i].startswith("────")]


def test_run_returns_the_commands_exit_code_and_prints_a_summary():
    code = ("import time; x = bytearray(30 * 1024 * 1024); x[::4096] = b'y' * len(x[::4096]); "
            "time.sleep(2.5); raise SystemExit(7)")
    r = cli("run", "--interval", "0.5", "--gpu-source", "none", "--", "python3", "-c", code, timeout=90)
    assert r.returncode == 7, r.stderr
    assert "clusterwatch · job local-" in r.stderr
    assert "FAILED (exit code 7)" in r.stderr
    # the process table names the command: its row (the command's pid, as in the job id local-PID) says python3
    pid = re.search(r"job local-(\d+)", r.stderr).group(1)
    assert re.search(rf"^ +\S+ +\S+ +{pid} python3 ", r.stderr, re.MULTILINE), r.stderr


def test_run_passes_success_through():
    r = cli("run", "--interval", "0.5", "--gpu-source", "none", "--", "true", timeout=90)
    assert r.returncode == 0, r.stderr


def test_run_with_a_missing_command_says_so():
    r = cli("run", "--gpu-source", "none", "--", "/nonexistent/cmd-xyz", timeout=60)
    assert r.returncode == 127
    assert "command not found: /nonexistent/cmd-xyz" in r.stderr


def test_demo_runs_to_the_end_and_leaves_no_process(tmp_path):
    proc = subprocess.Popen([*CLI, "demo", "--duration", "65", "--interval", "0.5", "--refresh", "5",
                             "--keep", str(tmp_path / "demo")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=clean_environ())
    try:
        wait_for(lambda: len(_descendants(proc.pid)) >= 7, timeout=60, what="demo processes")
        started = _descendants(proc.pid)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err + out
    assert "demo-node1" in out and "demo-node2" in out
    assert "\x1b" not in out  # stdout is a pipe: no screen codes, and each refresh's time carries its zone
    assert re.search(r"\n--- \d\d:\d\d:\d\d [A-Z][A-Za-z0-9+-]*\n", out)
    # the docs' sample report (the page on reading status) shows the sections a live report has, in their order
    last_live = out.split("\nDemo time is up")[0].rsplit("\n--- ", 1)[1]
    samples = [page.read_text().split("$ clusterwatch status ", 1)[1].split("```", 1)[0]
               for page in sorted((ROOT / "docs").rglob("*.md")) if "$ clusterwatch status " in page.read_text()]
    sample = next(x for x in samples if "Processes (by rank)" in x)
    assert _sections(sample) == _sections(last_live)
    # the closing summary says the demo ended the job, not that it crashed, and its notes do not read as an OOM
    summary = out.split("The job's summary as stored when it ended", 1)[1]
    assert "The demo ended the job; it did not crash, and the Alerts below were caught" in summary
    assert "COMPLETED" in summary and "out-of-memory kill" not in summary
    # the ranks run the code of this clone, and the report says which
    assert f"{ROOT} @ " in summary.split("\nCode (git provenance)\n", 1)[1]
    assert f"Logs in {tmp_path / 'demo'}." in out  # kept: the folder named is there
    for rank in range(4):
        assert f"\n      {rank} demo-node" in out  # every rank shows in the table
    # the growing rank is flagged while the demo runs, with the demo's short-window rules
    assert "FIRING   gpu_memory_leak" in out and "FIRING   host_memory_leak" in out
    assert "rank 3 (pid" in out
    # every process the demo started is gone: collector, agents and ranks
    assert not [p for p in started if _alive(p)]


def test_demo_interrupted_leaves_no_process(tmp_path):
    proc = subprocess.Popen([*CLI, "demo", "--duration", "120", "--interval", "0.5", "--keep",
                             str(tmp_path / "demo")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_environ())
    try:
        # wait until the collector, both agents and the four ranks run
        wait_for(lambda: len(_descendants(proc.pid)) >= 7, timeout=60, what="demo processes")
        started = _descendants(proc.pid)
        time.sleep(2)
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    wait_for(lambda: not any(_alive(p) for p in started), timeout=20, what="all demo processes gone")
    assert "Interrupted" in proc.stderr.read()
    assert proc.returncode == 130  # as a shell reports Ctrl-C


def test_run_in_a_deep_folder_still_gets_the_training_socket(tmp_path):
    # the spool's socket path is past what a Unix socket takes (108 bytes): the agent died at start
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    script = "import time; time.sleep(3)"
    before = set(Path("/tmp").glob("clusterwatch-sockets-*"))
    r = cli("run", "--interval", "0.5", "--gpu-source", "none", "--keep", str(deep), "--",
            sys.executable, "-c", script, timeout=90)
    assert r.returncode == 0, r.stderr
    assert "no samples" not in r.stderr and "clusterwatch · job local-" in r.stderr
    assert set(Path("/tmp").glob("clusterwatch-sockets-*")) <= before, "the short socket folder goes with the run"


def test_run_shows_its_job_where_munge_is_installed_but_does_not_answer(tmp_path):
    # munge and unmunge are on this machine; a socket nobody serves is munged down, as before it starts
    r = cli("run", "--interval", "0.5", "--gpu-source", "none", "--", "sleep", "2", timeout=90,
            env={"CLUSTERWATCH_MUNGE_SOCKET": str(tmp_path / "no-munged.socket")})
    assert r.returncode == 0, r.stderr
    assert "no samples" not in r.stderr and "clusterwatch · job local-" in r.stderr
