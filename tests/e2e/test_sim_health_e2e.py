"""Simulated GPU health end to end: a scenario's XID, lost GPU and throttling, played by a real agent with the
simulated GPU source, reach a real collector's health rules and `clusterwatch health`, as a real GPU's would."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import (
    CLI,
    SIM_RUN,
    Collector,
    Proc,
    clean_environ,
    cli,
    firing_alert,
    unique_job_id,
    wait_for,
)

pytestmark = pytest.mark.e2e
NODE = "sim-health-node"
JOB_ID = unique_job_id()

# events a few seconds after the agent starts: by then its first poll, which holds the ranks, is in
SCENARIO = """
[gpus]
count = 4
memory_mib = 16384
base_memory_mib = 100

[profiles.steady]
kind = "steady"
memory_mib = 2048
utilization = 80

[[events]]
at_s = 3
gpu = 0
kind = "xid"
xid = 48

[[events]]
at_s = 4
gpu = 1
kind = "lost"

[[events]]
at_s = 0
gpu = 2
kind = "throttle"
reasons = ["hw_thermal_slowdown"]
temperature_c = 92
"""


def _troubled(collector: Collector) -> dict | None:
    """`clusterwatch health --json` once it lists the XID, the lost GPU and the throttled one."""
    r = cli("health", "--collector", collector.address, "--json")
    if r.returncode != 0:
        return None
    doc = json.loads(r.stdout)
    by_index = {g.get("index"): g for g in doc["gpus"]}
    ready = (by_index.get(0, {}).get("xids") and by_index.get(1, {}).get("lost")
             and by_index.get(2, {}).get("throttle_reasons"))
    return doc if ready else None


def test_a_scenarios_health_events_reach_clusterwatch_health(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SCENARIO)
    collector = Collector(tmp_path)
    ranks = [Proc([sys.executable, "-c", "import time; time.sleep(300)"], tmp_path / f"rank{i}.log",
                  env=dict(clean_environ(), RANK=str(i), LOCAL_RANK=str(i), WORLD_SIZE="3",
                           CLUSTERWATCH_SIM_GPU=str(i), CLUSTERWATCH_SIM_RUN=SIM_RUN))
             for i in range(3)]
    pids = [a for rank in ranks for a in ("--pid", str(rank.pid))]
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", NODE, "--gpu-source", "sim",
                  "--sim-scenario", str(scenario), "--sim-run", SIM_RUN, "--interval", "0.5",
                  "--send-interval", "0", "--health-interval", "1", "--kmsg", "none", "--no-provenance",
                  "--spool-dir", str(tmp_path / "spool"), "--train-socket", str(tmp_path / "train.sock"),
                  "--job-id", JOB_ID, *pids], tmp_path / "agent.log")
    try:
        try:
            doc = wait_for(lambda: _troubled(collector), timeout=60, interval=0.5,
                           what="the XID, the lost GPU and the throttling in clusterwatch health --json")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{collector.text()[-3000:]}\n{agent.text()[-3000:]}") from None
        by_index = {g["index"]: g for g in doc["gpus"]}
        assert sorted(by_index) == [0, 1, 2]            # GPU 3 had no event: healthy GPUs are not listed
        assert all(g["node"] == NODE for g in doc["gpus"])
        assert by_index[0]["xids"] == [{"xid": 48, "count": 1}] and by_index[0]["severity"] == "critical"
        assert by_index[1]["lost"] is True and by_index[1]["severity"] == "critical"
        assert by_index[2]["throttle_reasons"] == ["hw_thermal_slowdown"] and by_index[2]["temperature_c"] == 92
        assert not by_index[0]["lost"] and not by_index[0]["throttle_reasons"]

        # the alerts name the job and the rank on the GPU, as they do for a real GPU
        xid = wait_for(lambda: firing_alert(collector, "gpu_xid"), timeout=30, what="gpu_xid firing")
        assert (xid["job_id"], xid["rank"], xid["gpu"]) == (JOB_ID, 0, by_index[0]["gpu"])
        lost = wait_for(lambda: firing_alert(collector, "gpu_lost"), timeout=30, what="gpu_lost firing")
        assert (lost["job_id"], lost["rank"], lost["gpu"]) == (JOB_ID, 1, by_index[1]["gpu"])
        # said once: by the XID 79 or by the failed reads, whichever the agent took first (two threads)
        assert "fell off the bus" in lost["description"]
        assert by_index[1]["xids"] == [{"xid": 79, "count": 1}] and len(by_index[1]["findings"]) == 1

        text = cli("health", "--collector", collector.address)
        assert text.returncode == 0, text.stderr
        assert "XID 48" in text.stdout and "throttled: hw_thermal_slowdown" in text.stdout
        assert "fell off the bus" in text.stdout
    finally:
        agent_code = agent.stop()
        for rank in ranks:
            rank.stop()
        collector.stop()
    assert agent_code == 0, agent.text()


def test_a_bad_event_in_the_scenario_stops_the_agent_with_one_line(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SCENARIO.replace('reasons = ["hw_thermal_slowdown"]', 'reasons = ["too_hot"]'))
    r = subprocess.run([*CLI, "agent", "--once", "--gpu-source", "sim", "--sim-scenario", str(scenario),
                        "--node", NODE, "--spool-dir", str(tmp_path / "spool"),
                        "--train-socket", str(tmp_path / "train.sock")],
                       env=clean_environ(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert f"scenario {scenario}: line 27: [events #3] reasons holds unknown reason 'too_hot'" in line
