"""bench/bench_detection.py runs in its --quick mode and prints its table, each kind caught with no false alarm.

No timing is asserted; the table's shape and the counts, which do not depend on the machine, are.
"""
from __future__ import annotations

import os
import subprocess
import sys

from tests.support.helpers import ROOT


def test_detection_table():
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTERWATCH_")}
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_detection.py"), "--quick", "--no-anchor"],
                         capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line for line in out.stdout.splitlines() if line.startswith("| ")}
    assert "| kind | caught | false alarms | median delay (min) | p90 delay (min) | noise bound" in out.stdout
    assert rows["linear_leak"].split("|")[2].strip() == "1/1"
    assert rows["one_step"].split("|")[3].strip() == "0"
    assert rows["**all**"].split("|")[2].strip() == "2/2"
