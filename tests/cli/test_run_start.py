"""`clusterwatch run` starts its command once the agent listens (issue 26): none of the command's first training
reports is lost, and a command shorter than one poll is still sampled, so its report knows its user."""
from __future__ import annotations

import getpass
import json
import subprocess
import sys

import pytest

from tests.support.helpers import CLI, clean_environ

pytestmark = pytest.mark.e2e

# reports from the first instruction on, each one counted by clusterwatch.train as sent or dropped
REPORTER = """
import time
import clusterwatch.train as train
for step in range(25):
    train.report(step=step, loss=1.0 / (step + 1), lr=0.001)
    time.sleep(0.02)  # the agent's reader keeps up (its socket's queue holds ~10 datagrams)
print(f"sent={train.sent()} dropped={train.dropped()}")
"""


def _run(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "run", "--gpu-source", "none", "--status-every", "0", *args],
                          capture_output=True, text=True, timeout=120, env=clean_environ(), cwd=str(tmp_path))


def test_no_training_report_of_the_first_ones_is_lost(tmp_path):
    script = tmp_path / "report.py"
    script.write_text(REPORTER)
    done = _run(tmp_path, "--", sys.executable, str(script))
    assert done.returncode == 0, done.stderr
    assert "sent=25 dropped=0" in done.stdout, done.stdout + done.stderr


def test_a_command_shorter_than_a_poll_is_sampled_with_its_user(tmp_path):
    done = _run(tmp_path, "--interval", "30", "--json", "--", "sleep", "0.5")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["job"]["user"] == getpass.getuser(), doc["job"]
    assert [p["command"] for p in doc["processes"]] == ["sleep"], doc["processes"]


@pytest.mark.parametrize(("command", "line", "code"), [
    ("no-such-command-here", "command not found: no-such-command-here", 127),
    ("./data.txt", "command not executable: ./data.txt", 126),
])
def test_a_command_that_cannot_start_says_why_as_a_shell_does(tmp_path, command, line, code):
    (tmp_path / "data.txt").write_text("not a program\n")  # mode 0644: no one may execute it
    done = _run(tmp_path, "--", command)
    assert done.returncode == code, done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"clusterwatch: {line}", done.stderr
