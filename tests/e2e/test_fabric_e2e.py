"""The node's fabric, end to end (issue 28, part 4): a real agent reads a fake /sys/class/infiniband tree and a kernel
log file on its health cadence; two ranks of a job report steps through clusterwatch.train, then stall. While the tree
stands still nothing is raised, and a stall's cause is not the fabric. Once a port's link goes down and comes back
between two readings (link_downed rises: a flap), a real collector's training_stall of the stalled job names that port
as its likely cause; once an NVSwitch's SXID line reaches the kernel log, `health --json` lists the node with
fabric_port and nvswitch_sxid, and /metrics has the trouble and the SXID."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.support.helpers import clean_environ, cli, metric_value, wait_for
from tests.support.stalling_job import StallingJob, start_stalling_job

pytestmark = pytest.mark.e2e

NODE = "fab-node"
SXID = ("nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up")


def write_port(root: Path, device: str, n: int, *, rate: str = "200 Gb/sec (4X HDR)", **counters: int) -> None:
    """A port's folder as the kernel lays it out (agent/health/fabric.py), ACTIVE and LinkUp; each file written whole
    through a rename, so the agent never reads half of one."""
    port = root / device / "ports" / str(n)
    (port / "counters").mkdir(parents=True, exist_ok=True)
    files = {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": rate, "link_layer": "InfiniBand",
             **{f"counters/{name}": str(value) for name, value in counters.items()}}
    for name, text in files.items():
        tmp = port / f"{name}.new"
        tmp.write_text(text + "\n")
        tmp.replace(port / name)


def health_nodes(job: StallingJob) -> list[dict]:
    r = cli("health", "--collector", job.collector.address, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["nodes"]


def batches(job: StallingJob) -> float:
    return metric_value(job.collector.metrics(), "clusterwatch_ingest_batches_total") or 0.0


def start(tmp_path: Path, *agent_args: str, rates: dict[str, str] | None = None) -> tuple[StallingJob, Path]:
    """The job, its agent reading the tree (two ports, `rates` more by device: DEVICE/1 at that rate) from its first
    reading, and the collector."""
    tree = tmp_path / "infiniband"
    write_port(tree, "mlx5_0", 1, link_downed=2, link_error_recovery=1, symbol_error=7, port_rcv_errors=0)
    write_port(tree, "mlx5_1", 1, link_downed=0, link_error_recovery=0, symbol_error=0, port_rcv_errors=0)
    for device, rate in (rates or {}).items():
        write_port(tree, device, 1, rate=rate, link_downed=0)
    env = {k: v for k, v in clean_environ().items() if not k.startswith("SLURM")}
    job = start_stalling_job(tmp_path, NODE, env, ["--gpu-source", "none", "--ib-sysfs", str(tree),
                                                   "--health-interval", "1", *agent_args], kmsg=True, by_pid=True)
    return job, tree


def troubles(metrics: str) -> set[float]:
    """The values of every clusterwatch_fabric_port_trouble series (both ports, each kind)."""
    got = [float(line.rpartition(" ")[2]) for line in metrics.splitlines()
           if line.startswith("clusterwatch_fabric_port_trouble{")]
    assert len(got) == 8, metrics
    return set(got)


def quiet_readings(job: StallingJob) -> str:
    """Wait until the collector holds the ports' readings and 6 polls more (3 s: three more readings of the tree, a
    second apart); the metrics then."""
    wait_for(lambda: metric_value(job.collector.metrics(), "clusterwatch_fabric_port_active", node=NODE,
                                  port="mlx5_1/1") == 1, timeout=60, what="the ports' readings on /metrics")
    seen = batches(job)
    wait_for(lambda: batches(job) >= seen + 6, timeout=60, what="6 polls stored after the first reading")
    return job.collector.metrics()


def test_a_flapping_port_and_an_sxid_are_the_stalled_jobs_likely_cause(tmp_path: Path) -> None:
    job, tree = start(tmp_path)
    try:
        job.both_advance(30)
        metrics = quiet_readings(job)
        # the tree stood still: its counters (some not zero, as a port that has lived has) raise nothing
        assert health_nodes(job) == [], health_nodes(job)
        assert metric_value(metrics, "clusterwatch_fabric_port_errors_total", node=NODE, port="mlx5_0/1",
                            counter="symbol_error") == 7, metrics
        assert "clusterwatch_nvswitch_sxid_errors_total{" not in metrics, metrics
        assert troubles(metrics) == {0.0}, metrics
        # mlx5_0/1's link goes down and comes back between two readings; the switch faults
        # mlx5_0/1's link goes down and comes back between two readings (a flap); the ranks stop in a collective
        write_port(tree, "mlx5_0", 1, link_downed=3, link_error_recovery=1, symbol_error=7, port_rcv_errors=0)
        job.stall()
        stall = job.stall_with(0, "likely cause: fabric port mlx5_0/1")
        assert (stall["cause"], stall["cause_node"]) == ("fabric", NODE), stall
        assert f"likely cause: fabric port mlx5_0/1 on {NODE}" in stall["description"], stall
        assert "flapping: went down 1 time" in stall["description"], stall
        view = json.loads(job.status("--json").stdout)
        [alert] = [a for a in view["alerts"] if a["rule"] == "training_stall" and a["rank"] == 0]
        assert (alert["cause"], alert["cause_node"]) == ("fabric", NODE), alert
        # then the node's NVSwitch faults
        job.kernel_says(2, SXID)
        nodes = wait_for(lambda: (n := health_nodes(job)) and {f["rule"] for f in n[0]["findings"]} >= {
            "fabric_port", "nvswitch_sxid"} and n, timeout=60, what="fabric_port and nvswitch_sxid on the node")
        assert [n["node"] for n in nodes] == [NODE], nodes
        found = {f["rule"]: f for f in nodes[0]["findings"]}
        assert (found["fabric_port"]["gpu"], found["nvswitch_sxid"]["gpu"]) == ("mlx5_0/1", "PCI:0000:06:00.0"), found
        assert "flapping: went down 1 time" in found["fabric_port"]["description"], found
        assert "SXID 20034 (Fatal)" in found["nvswitch_sxid"]["description"], found
        assert job.job_id in nodes[0]["jobs"], nodes
        metrics = job.collector.metrics()
        assert metric_value(metrics, "clusterwatch_fabric_port_trouble", node=NODE, port="mlx5_0/1",
                            kind="flapping") == 1, metrics
        assert metric_value(metrics, "clusterwatch_fabric_port_trouble", node=NODE, port="mlx5_1/1",
                            kind="flapping") == 0, metrics
        assert metric_value(metrics, "clusterwatch_fabric_port_errors_total", node=NODE, port="mlx5_0/1",
                            counter="link_downed") == 3, metrics
        assert metric_value(metrics, "clusterwatch_nvswitch_sxid_errors_total", node=NODE, switch="PCI:0000:06:00.0",
                            sxid="20034", fatal="1") == 1, metrics
    finally:
        agent_code = job.close()
    assert agent_code == 0, job.agent.text()


def test_a_quiet_tree_is_no_stalls_cause(tmp_path: Path) -> None:
    job, _ = start(tmp_path)
    try:
        job.both_advance(30)
        quiet_readings(job)
        job.stall()
        stall = wait_for(lambda: job.stall_of_rank(0), timeout=60, what="rank 0's training_stall")
        time.sleep(4)   # the cause is worked out every few seconds: a fabric one would be there by now
        stall = job.stall_of_rank(0)
        assert stall.get("cause") != "fabric" and "fabric" not in stall["description"], stall
        assert health_nodes(job) == []
        metrics = job.collector.metrics()
        assert troubles(metrics) == {0.0} and "clusterwatch_nvswitch_sxid_errors_total{" not in metrics, metrics
    finally:
        agent_code = job.close()
    assert agent_code == 0, job.agent.text()


def test_a_port_that_trained_narrow_at_boot_is_degraded_against_the_rate_expected(tmp_path: Path) -> None:
    # from the agent's first reading on: mlx5_2/1 trained on one lane of its four at boot (it never ran faster);
    # half of a split cable (HDR100, 2X) is what the site expects of mlx5_4
    job, _ = start(tmp_path, "--ib-expect-rate", "200,mlx5_4=100",
                   rates={"mlx5_2": "50 Gb/sec (1X HDR)", "mlx5_4": "100 Gb/sec (2X HDR)"})
    try:
        [node] = wait_for(lambda: health_nodes(job), timeout=60, what="a finding on the node")
        assert [(f["rule"], f["gpu"]) for f in node["findings"]] == [("fabric_port", "mlx5_2/1")], node
        assert "runs at 50 Gb/s (1X HDR), below the 200 Gb/s the site expects of it" in (
            node["findings"][0]["description"]), node
        metrics = job.collector.metrics()
        assert metric_value(metrics, "clusterwatch_fabric_port_trouble", node=NODE, port="mlx5_2/1",
                            kind="degraded") == 1, metrics
        for port in ("mlx5_0/1", "mlx5_1/1", "mlx5_4/1"):
            assert metric_value(metrics, "clusterwatch_fabric_port_trouble", node=NODE, port=port,
                                kind="degraded") == 0, metrics
    finally:
        agent_code = job.close()
    assert agent_code == 0, job.agent.text()
