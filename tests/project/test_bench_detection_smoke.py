"""bench/bench_detection.py runs in its --quick mode and prints its tables: each kind caught with no false alarm,
and a slice of the soak (a process-day of every benign kind) quiet for every rule.

No timing is asserted; the table's shape and the counts, which do not depend on the machine, are.
"""
from __future__ import annotations

import os
import subprocess
import sys

from tests.support.helpers import ROOT
from tests.synth_traces import KINDS_BENIGN


def test_detection_table():
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTERWATCH_")}
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_detection.py"), "--quick", "--no-anchor"],
                         capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line for line in out.stdout.splitlines() if line.startswith("| ")}
    assert ("| kind | rule | caught | false alarms | false alarms / 1,000 process-days (soak) | median delay (min) "
            "| p90 delay (min) | noise bound") in out.stdout
    assert rows["linear_leak"].split("|")[2].strip() == "gpu_memory_leak"
    assert rows["linear_leak"].split("|")[3].strip() == "1/1"
    assert rows["one_step"].split("|")[4].strip() == "0"
    assert rows["**all**"].split("|")[3].strip() == "2/2"
    assert f"soak: {len(KINDS_BENIGN)} benign process-days" in out.stdout
    for rule in ("gpu_memory_leak", "host_memory_leak", "handle_leak", "gpu_stall", "training_stall", "idle_gpu"):
        assert rows[rule].split("|")[2:4] == [" 0 ", " 0.0 "], rows[rule]


def test_rules_interval_shows_what_the_live_collector_shows():
    # live, each process is shown to the rules once its last shown sample is rules-interval old (observations.py)
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_detection", ROOT / "bench" / "bench_detection.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = [{"t": float(t), "node": "n1", "pid": pid} for t in range(100) for pid in (1, 2)]
    assert bench._shown(rows, 0.0) is rows
    shown = bench._shown(rows, 5.0)
    for pid in (1, 2):
        ts = [r["t"] for r in shown if r["pid"] == pid]
        assert ts == [float(t) for t in range(0, 100, 5)]


def test_intervals_runs_only_the_draws_and_soak_days_of_those_polls():
    # draw 7 of 8 and soak day 7 of 11 are the only ones polled every 60 s (the intervals cycle 1, 5, ..., 60 s)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTERWATCH_")}
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_detection.py"), "--draws", "8", "--kinds",
                          "linear_leak", "--intervals", "60", "--soak-days", "11", "--no-dev", "--no-anchor"],
                         capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line for line in out.stdout.splitlines() if line.startswith("| ")}
    assert rows["linear_leak"].split("|")[3].strip() == "1/1"
    assert "(only those at 60 s run)" in out.stdout and "soak: 1 benign process-days" in out.stdout
