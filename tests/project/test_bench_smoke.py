"""Each bench script runs in its --quick mode, prints its table, and leaves no process behind.

No timing is asserted (the figures depend on the machine); the tables' shape and the
correctness figures that do not depend on speed (every sample acknowledged) are.
"""
from __future__ import annotations

import os
import subprocess
import sys
import uuid

from tests.support.helpers import ROOT, left_behind

BENCH = ROOT / "bench"


def run_quick(script: str) -> str:
    marker = uuid.uuid4().hex
    env = dict(os.environ, CW_BENCH_SMOKE=marker)
    env.pop("CLUSTERWATCH_COLLECTOR", None)
    out = subprocess.run([sys.executable, str(BENCH / script), "--quick"], capture_output=True, text=True,
                         timeout=240, env=env, cwd=BENCH.parent)
    assert out.returncode == 0, f"{script} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    assert left_behind("CW_BENCH_SMOKE", marker) == [], f"{script} left processes running"
    return out.stdout


def rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_agent_table():
    text = run_quick("bench_agent.py")
    assert "Agent: CPU ms per poll, 64 watched processes, 8 simulated GPUs" in text
    for label in ("clusterwatch Agent.poll + serialise", "seed: psutil ×64 + /bin/sh printf stand-in",
                  "real `clusterwatch agent` process", "64 processes sampled (64 on 8 simulated GPUs)",
                  "target ≥ 10× cheaper", "RSS"):
        assert label in text


def test_ingest_table():
    text = run_quick("bench_ingest.py")
    assert "Collector ingest: samples per second per core" in text
    for label in ("bare gRPC receive (ack-only servicer)", "clusterwatch collector (gRPC + CollectorCore.batch)",
                  "CollectorCore.batch alone, in process"):
        assert label in text
    assert "rules ON: CollectorCore listeners = " in text  # the figure is "with the rules on" (issue 25)
    # every sample sent to the real collector was acknowledged and counted by it
    line = next(x for x in rows(text) if "real collector:" in x)
    # 2 streams × (a first batch of one poll + 19 of five) × 64
    assert "12,288 samples sent, 12,288 acknowledged" in line and line.endswith("= 12,288")


def test_metrics_table():
    text = run_quick("bench_metrics.py")
    assert "/metrics generation, 20 nodes at the default cardinality" in text
    line = next(x for x in rows(text) if x.startswith("clusterwatch ClusterCollector"))
    assert int(line.split()[-3].replace(",", "")) > 1000  # series
    assert "state: 20 nodes, 160 GPUs, 20 jobs, 1,280 processes" in text
    assert "baseline: prometheus_client labelled Gauges" in text


def test_cli_table():
    text = run_quick("bench_cli.py")
    assert "CLI wall time, Python start-up included" in text
    for label in ("python -c pass", 'python -c "import grpc"', "clusterwatch status 8888",
                  "clusterwatch prolog"):
        assert label in text
    assert "512 processes" in text


def test_load_table():
    text = run_quick("load.py")
    assert "Load: simulated agents against one collector" in text
    line = next(x for x in rows(text) if x.startswith("dropped (sent − acknowledged)"))
    assert line.split()[-1] == "0"
    line = next(x for x in rows(text) if x.startswith("stream errors"))
    assert line.split()[-1] == "0"


def test_e2e_table():
    text = run_quick("bench_e2e.py")
    assert "End to end (issue 2): the small benchmark" in text
    for label in ("agent CPU per poll, 64 procs, 8 sim GPUs", "collector CPU per 1,000 ingested samples",
                  "`clusterwatch status JOBID` wall, 8 nodes × 8 ranks"):
        assert label in text


def test_sender_table():
    text = run_quick("bench_sender.py")
    assert "Agent stream: CPU of the sending side" in text
    for label in ("baseline: synchronous grpc stream", "clusterwatch Sender (grpc.aio, one thread)"):
        line = next(x for x in rows(text) if x.startswith(label))
        assert line.split()[-1] == "11/11"  # every batch acknowledged
