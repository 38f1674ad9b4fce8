"""The Grafana dashboards against real data: every panel's PromQL parses and returns series.

There is no Grafana server to install here (TESTBED.md), so the dashboards are checked the way Grafana
would use them: a real collector fed by two real agents with simulated GPUs and a real four-rank workload
(one job, like `clusterwatch demo`), a real Prometheus scraping the collector every second with the shipped
alert rules, and each panel's query, with the dashboard's variables filled in, sent to /api/v1/query.

The workload is built so that panels about trouble have something to show: rank 3 leaks GPU memory, a
process holds GPU 2 of node 2 and does nothing on it, and GPU 3 of node 2 is allocated to the job with no
process on it (a dead rank). A third agent reads two GPUs through the real pynvml and the C stand-in for
the driver, with health trouble for the health panels: an XID in its kernel log, uncorrected ECC errors, a
GPU held down by thermal slowdown. The collector's idle rules are shortened to seconds so its own alerts fire too.
No query is allowed to come back empty.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clusterwatch.agent.spool import write_event

from clusterwatch.model import JobEvent
from tests.fakes.nvml_stub import child_env, fixtures, write_state
from tests.services.procs import require_binary
from tests.services.prometheus import Prometheus, prometheus_factory  # noqa: F401  (registers the fixture)
from tests.support.helpers import CLI, ROOT, SIM_RUN, Collector, Proc, kmsg_record

pytestmark = pytest.mark.prometheus

DASHBOARDS = ROOT / "deploy" / "grafana" / "dashboards"
ALERT_RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
JOB_ID = "dash-test"
NODES = ("dash-node1", "dash-node2")
HEALTH_NODE = "dash-node3"
stub_lib = fixtures.stub_lib  # the NVML stand-in's fixture, used by name
LEAKING_RANK = 3

# Grafana's built-in variables, as Grafana would fill them for a 1 s scrape interval.
BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m"}

# The collector's own rules with times of seconds instead of minutes, so that the idle GPUs raise
# clusterwatch_alert series within the test and every alert panel has data to show. The held GPU's process
# was never busy, so gpu_stall must not wait for it to have been (require_busy_first). Sections not named
# keep the shipped defaults.
TEST_RULES = """\
[gpu_stall]
for_s = 4
pending_after_s = 2
require_busy_first = false

[idle_gpu]
for_s = 4
"""


def _dashboards() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def _panels(panels: list[dict]):
    for p in panels:
        yield p
        yield from _panels(p.get("panels", []))


def _substitute(expr: str, values: dict[str, str]) -> str:
    def repl(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise AssertionError(f"{expr!r} uses ${name}, which is neither a dashboard variable nor a builtin")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", repl, expr)


def _variable_values(dash: dict) -> dict[str, str]:
    """What each template variable stands for in the test: the job, "All" (.*), or the default choice."""
    values = dict(BUILTINS)
    for var in dash["templating"]["list"]:
        name = var["name"]
        if name == "job_id":
            values[name] = JOB_ID
        elif var.get("includeAll"):
            values[name] = var["allValue"]
        elif var["type"] == "custom":
            values[name] = var["current"]["value"]
        elif var["type"] == "datasource":
            values[name] = "prometheus"
    return values


def _queries(dash: dict) -> list[tuple[str, str, str]]:
    """(panel title, raw expr, expr with variables filled in) for every target of every panel."""
    values = _variable_values(dash)
    out = []
    for panel in _panels(dash["panels"]):
        for t in panel.get("targets", []):
            out.append((panel["title"], t["expr"], _substitute(t["expr"], values)))
    return out


# ----------------------------------------------------------------------------------------- static checks


def test_promtool_accepts_the_shipped_config() -> None:
    promtool = require_binary("promtool", "prometheus")
    out = subprocess.run([promtool, "check", "config", str(ROOT / "deploy" / "prometheus" / "prometheus.yml")],
                         capture_output=True, text=True, timeout=60)
    # `check config` also checks the rule files it names (alerts.yml beside it).
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr


@pytest.mark.parametrize("name", ["clusterwatch-job", "clusterwatch-cluster"])
def test_dashboard_is_well_formed(name: str) -> None:
    dash = _dashboards()[name]
    assert dash["uid"] == name
    panels = list(_panels(dash["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids in {name}"
    for p in panels:
        pos = p["gridPos"]
        assert pos["x"] + pos["w"] <= 24, f"{p['title']} runs off the 24-column grid"
        if p["type"] == "row":
            continue
        # Every data panel queries the data source chosen in the dashboard, so it works whatever the
        # Prometheus data source is called in the operator's Grafana.
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p.get("targets"), f"panel {p['title']!r} has no query"
        for t in p["targets"]:
            assert t["expr"].strip(), p["title"]
    names = {v["name"] for v in dash["templating"]["list"]}
    assert "datasource" in names
    if name == "clusterwatch-job":
        job_var = next(v for v in dash["templating"]["list"] if v["name"] == "job_id")
        assert job_var["query"]["query"] == "label_values(clusterwatch_job_info, job_id)"


def test_job_dashboard_shows_the_leak_slope_with_deriv() -> None:
    exprs = [raw for _, raw, _ in _queries(_dashboards()["clusterwatch-job"])]
    assert any(e.startswith("deriv(clusterwatch_rank_gpu_memory_used_bytes") for e in exprs)


# ----------------------------------------------------------------------------------------- live checks


def _start_rank(rank: int, node: str, local: int, tmp: Path, spool: Path) -> Proc:
    env = dict(os.environ)
    env.update({
        "RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": "4",
        "CLUSTERWATCH_SIM_GPU": str(local), "CLUSTERWATCH_SIM_NODE": node, "CLUSTERWATCH_SIM_PROFILE": "steady",
        "CLUSTERWATCH_SIM_RUN": SIM_RUN,
        "CLUSTERWATCH_SIM_GPU_MEM_FILE": str(tmp / f"gpu-mem-rank{rank}"),
        "CLUSTERWATCH_TRAIN_SOCKET": str(spool / "train.sock"),
    })
    args = [sys.executable, "-m", "clusterwatch.cli.demo_workload", "--rank", str(rank), "--step-s", "0.1"]
    if rank == LEAKING_RANK:
        # 40 MiB/s of simulated GPU memory: a slope no noise can hide within a few seconds.
        args += ["--gpu-leak-mib-per-s", "40"]
    return Proc(args, tmp / f"rank{rank}.log", env=env)


def _start_idle_holder(node: str, gpu: int, tmp: Path) -> Proc:
    # A real process that holds a simulated GPU at 0 % (the `idle` profile): a hung data loader.
    env = dict(os.environ)
    env.update({"CLUSTERWATCH_SIM_GPU": str(gpu), "CLUSTERWATCH_SIM_NODE": node, "CLUSTERWATCH_SIM_PROFILE": "idle",
                "CLUSTERWATCH_SIM_RUN": SIM_RUN})
    return Proc([sys.executable, "-c", "import time; time.sleep(600)"], tmp / "idle.log", env=env)


def _start_health_node(collector: Collector, stub: Path, tmp: Path) -> Proc:
    """An agent over the NVML stand-in: GPU 0 throttled (thermal) and hot with uncorrected ECC errors, an XID
    48 in the kernel log; GPU 1 healthy."""
    state = tmp / "nvml-state.txt"
    write_state(state, "gpu GPU-dash0 total=85899345920 used=0 util=0 power=90000 pci=0000:3b:00 temp=88 "
                       "throttle=0x40 name=NVIDIA H100\n"
                       "gpu GPU-dash1 total=85899345920 used=0 util=0 power=70000 pci=0000:3c:00 temp=41 "
                       "name=NVIDIA H100\n"
                       "ecc GPU-dash0 uncorrected_volatile=3 uncorrected_aggregate=3\n")
    kmsg = tmp / "kmsg"
    kmsg.write_text(kmsg_record(1, "NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error"))
    return Proc([*CLI, "agent", "--collector", collector.address, "--node", HEALTH_NODE, "--gpu-source", "nvml",
                 "--interval", "1", "--no-provenance", "--spool-dir", str(tmp / "spool" / HEALTH_NODE),
                 "--train-socket", str(tmp / "health-train.sock"), "--kmsg", str(kmsg)],
                tmp / f"agent-{HEALTH_NODE}.log", env={**child_env(stub, state), "SLURMD_NODENAME": HEALTH_NODE})


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, prometheus_factory, stub_lib: Path):  # noqa: F811  (the imported fixture)
    tmp = tmp_path_factory.mktemp("dashboards")
    procs: list[Proc] = []
    rules = tmp / "rules.toml"
    rules.write_text(TEST_RULES)
    collector = Collector(tmp, "--rules", str(rules))
    try:
        now = time.time()
        spools = {node: tmp / "spool" / node for node in NODES}
        # What the Slurm prolog leaves for the agent: the job and its GPUs on this node. Node 2's GPU 3 is
        # allocated and never used.
        for node, gpus in zip(NODES, ("0,1", "0,1,2,3"), strict=True):
            spools[node].mkdir(parents=True)
            write_event(str(spools[node]), JobEvent("start", JOB_ID, now, os.getuid(), gpu_indexes=gpus))
        ranks = {node: [] for node in NODES}
        for rank in range(4):
            node = NODES[rank // 2]
            ranks[node].append(_start_rank(rank, node, rank % 2, tmp, spools[node]))
        idle = _start_idle_holder(NODES[1], 2, tmp)
        ranks[NODES[1]].append(idle)
        procs += [p for node in NODES for p in ranks[node]]
        for node in NODES:
            pid_args = [a for p in ranks[node] for a in ("--pid", str(p.pid))]
            procs.append(Proc([*CLI, "agent", "--collector", collector.address, "--node", node, "--gpu-source", "sim",
                               "--sim-run", SIM_RUN, "--interval", "1", "--spool-dir", str(spools[node]),
                               "--train-socket", str(spools[node] / "train.sock"), "--job-id", JOB_ID, *pid_args],
                              tmp / f"agent-{node}.log"))
        procs.append(_start_health_node(collector, stub_lib, tmp))
        prom = prometheus_factory([f"127.0.0.1:{collector.metrics_port}"], rule_files=[ALERT_RULES])
        try:
            prom.wait_for_series(f'clusterwatch_rank_steps_per_second{{job_id="{JOB_ID}"}}', count=4)
            # Enough scrapes for deriv(), rate() and the idle window to have points to work on.
            prom.wait_for_series("count_over_time(clusterwatch_node_up[1m]) >= 12", count=2)
            # The idle GPU's rank series makes the shipped gpu_stall rule pending (`for: 2m`).
            prom.wait_for_series('ALERTS{alertname="gpu_stall"}')
            prom.wait_for_series('clusterwatch_alert{rule="gpu_stall", state="firing"}')
            prom.wait_for_series(f'clusterwatch_gpu_temperature_celsius{{node="{HEALTH_NODE}"}}', count=2)
        except AssertionError as exc:
            logs = "\n".join(f"--- {p.log.name}\n{p.text()[-1500:]}" for p in [collector, *procs])
            raise AssertionError(f"{exc}\n{logs}") from None
        yield prom
    finally:
        for p in reversed(procs):
            p.stop()
        collector.stop()


def test_variable_queries_list_the_job(live: Prometheus) -> None:
    # label_values(metric, label) is Grafana's own function: ask Prometheus what it would ask.
    assert JOB_ID in live.label_values("job_id", "clusterwatch_job_info")
    assert set(live.label_values("node", f'clusterwatch_rank_rss_bytes{{job_id="{JOB_ID}"}}')) == set(NODES)
    ranks = live.label_values("rank", f'clusterwatch_rank_rss_bytes{{job_id="{JOB_ID}", node=~".*"}}')
    assert {"0", "1", "2", "3"} <= set(ranks)


@pytest.mark.parametrize("name", ["clusterwatch-job", "clusterwatch-cluster"])
def test_every_panel_query_parses_and_returns_data(live: Prometheus, name: str) -> None:
    problems = []
    queries = _queries(_dashboards()[name])
    assert queries
    for title, _raw, expr in queries:
        try:
            result = live.query(expr)
        except AssertionError as exc:  # PromQueryError: the query does not parse or is invalid
            problems.append(f"{title}: {expr}\n    error: {exc}")
            continue
        if not result:
            problems.append(f"{title}: {expr}\n    returned no series")
    assert not problems, f"{len(problems)} of {len(queries)} queries in {name}:\n" + "\n".join(problems)


def _panel_query(dash_name: str, title: str) -> str:
    dash = _dashboards()[dash_name]
    found = [expr for t, _, expr in _queries(dash) if t == title]
    assert found, f"no panel {title!r} in {dash_name}"
    return found[0]


def test_leak_slope_and_time_to_full_point_at_the_leaking_rank(live: Prometheus) -> None:
    slopes = {s["metric"]["rank"]: float(s["value"][1])
              for s in live.query(_panel_query("clusterwatch-job", "GPU memory growth per rank (leak slope)"))}
    # 40 MiB/s is 144,000 MiB/h; the steady ranks stay flat (their memory file holds a constant).
    assert slopes[str(LEAKING_RANK)] > 100_000, slopes
    assert all(abs(v) < 1_000 for r, v in slopes.items() if r != str(LEAKING_RANK)), slopes
    full = live.query(_panel_query("clusterwatch-job", "Hours until the GPU is full, at the current slope"))
    assert [(s["metric"]["node"], s["metric"]["index"]) for s in full] == [(NODES[1], "1")], full


def test_idle_gpus_are_the_held_and_unused_ones(live: Prometheus) -> None:
    idle = live.query(_panel_query("clusterwatch-cluster", "Idle GPUs held by jobs"))
    got = sorted((s["metric"]["node"], s["metric"]["index"]) for s in idle)
    # GPU 2: a process holds it at 0 %; GPU 3: allocated to the job, no process at all.
    assert got == [(NODES[1], "2"), (NODES[1], "3")], idle
    count = live.query(_panel_query("clusterwatch-cluster", "Idle GPUs in jobs"))
    assert float(count[0]["value"][1]) == 2


def test_health_panels_point_at_the_troubled_gpu(live: Prometheus) -> None:
    throttled = live.query(_panel_query("clusterwatch-cluster", "Throttled GPUs"))
    assert {(s["metric"]["node"], s["metric"]["index"], float(s["value"][1])) for s in throttled} == {
        (HEALTH_NODE, "0", 1.0), (HEALTH_NODE, "1", 0.0)}
    xids = live.query(_panel_query("clusterwatch-cluster", "XID errors by GPU"))
    assert [(s["metric"]["node"], s["metric"]["gpu"], s["metric"]["xid"]) for s in xids] == [
        (HEALTH_NODE, "GPU-dash0", "48")]
    memory = live.query(_panel_query("clusterwatch-cluster", "GPU memory errors"))
    assert [(s["metric"]["gpu"], float(s["value"][1])) for s in memory] == [("GPU-dash0", 3.0)]
    hottest = live.query(_panel_query("clusterwatch-cluster", "GPU temperature"))
    assert {s["metric"]["node"]: float(s["value"][1]) for s in hottest}[HEALTH_NODE] == 88
