"""The report of a real `clusterwatch run` counts the CPU time of the whole job (issue 17, item 11): a
process that keeps one core busy reads about one core on average, with its CPU time, and without Slurm's core
count the CPU line says what is known instead of "n/a"; host memory is not compared with the node's RAM."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support.helpers import CLI, clean_environ

pytestmark = pytest.mark.e2e

# 3 s of CPU, however long a loaded machine takes to give them: the figure checked is the CPU time
BURNER = """
import time
x = 0
while time.process_time() < 3:
    x += 1
"""


def test_run_reports_the_cpu_time_of_the_whole_job(tmp_path):
    script = tmp_path / "burn.py"
    script.write_text(BURNER)
    done = subprocess.run([*CLI, "run", "--interval", "0.3", "--gpu-source", "none", "--status-every", "0", "--",
                           sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env=clean_environ(), cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    report = done.stdout + done.stderr
    lines = report.splitlines()
    at = next((n for n, x in enumerate(lines) if x.startswith("  CPU ")), None)
    assert at is not None, report
    cpu = lines[at]
    for more in lines[at + 1:]:  # wrapped at 80 columns under its text
        if not more.startswith(" " * 19):
            break
        cpu += " " + more.strip()
    found = re.search(r"CPU\s+(\d+\.\d) cores busy on average \((\d+) s CPU time\); allocated cores unknown", cpu)
    assert found, cpu
    # one busy core for 3 s of CPU time (generous: the first poll comes late, the last may miss a little); its
    # share of the wall time is whatever the machine's load left it, at most about one core
    assert 0 < float(found.group(1)) <= 1.6 and 2 <= int(found.group(2)) <= 5, cpu
    host = next(x for x in report.splitlines() if x.startswith("  Host memory"))
    assert "allocation unknown" in host and "of node RAM" not in host, host
