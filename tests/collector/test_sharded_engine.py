"""The cluster-wide view past one collector: a real Prometheus scrapes two real collectors from the
file_sd list the collectors list generates (deploy/prometheus/prometheus-sharded.yml as shipped) and
remote-writes into a real VictoriaMetrics; a query there sees every shard. vmalert takes alerts.yml."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from clusterwatch.shards import pick
from tests.services.procs import require_binary
from tests.services.prometheus import running_prometheus
from tests.services.victoriametrics import running_victoriametrics
from tests.support.helpers import CLI, ROOT, Collector, Proc, cli, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.prometheus]

SHIPPED = ROOT / "deploy" / "prometheus" / "prometheus-sharded.yml"
SLEEPER = "import time; time.sleep(600)"


def test_generated_targets_follow_the_list_order_and_the_port_rule(tmp_path):
    out = subprocess.run([sys.executable, "-m", "clusterwatch.prometheus_targets", "--collectors",
                          "h1:50051,h1:50052,h2:50051"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [
        {"targets": ["h1:9750"], "labels": {"shard": "h1:50051"}},
        {"targets": ["h1:9751"], "labels": {"shard": "h1:50052"}},
        {"targets": ["h2:9750"], "labels": {"shard": "h2:50051"}},
    ]
    config = tmp_path / "config.toml"
    config.write_text('collectors = ["h1:50051", "h2:50052"]\n')
    out = tmp_path / "targets.json"
    subprocess.run([sys.executable, "-m", "clusterwatch.prometheus_targets", "--config", str(config), "-o", str(out)],
                   capture_output=True, text=True, check=True)
    assert [g["targets"] for g in json.loads(out.read_text())] == [["h1:9750"], ["h2:9751"]]
    bad = subprocess.run([sys.executable, "-m", "clusterwatch.prometheus_targets", "--collectors", "h1:50051,h1:50051"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "twice" in bad.stderr and "Traceback" not in bad.stderr


def test_vmalert_takes_the_shipped_alert_rules(tmp_path):
    vmalert = require_binary("vmalert", "victoria-metrics")
    ok = subprocess.run([vmalert, "-dryRun", f"-rule={ROOT / 'deploy/prometheus/alerts.yml'}"],
                        capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = tmp_path / "broken.yml"  # the check can fail
    broken.write_text("groups:\n  - name: x\n    rules:\n      - alert: X\n        expr: sum(\n")
    bad = subprocess.run([vmalert, "-dryRun", f"-rule={broken}"], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert bad.returncode != 0


def test_prometheus_remote_writes_every_shard_into_victoriametrics(tmp_path):
    started: list[Proc] = []
    try:
        collectors = [Collector(tmp_path, name=f"c{i}", db=tmp_path / f"c{i}.db") for i in range(2)]
        started += collectors
        grpc = tuple(c.address for c in collectors)
        jobs: dict[str, str] = {}  # collector address -> a job rendezvous hashing gives it
        i = 0
        while len(jobs) < 2:
            jobs.setdefault(pick(f"vm-{i}", grpc), f"vm-{i}")
            i += 1
        for n, (address, job) in enumerate(jobs.items()):
            work = Proc([sys.executable, "-c", SLEEPER], tmp_path / f"work{n}.log")
            started.append(work)
            started.append(Proc([*CLI, "agent", "--collector", address, "--node", f"vmnode{n}", "--interval", "0.5",
                                 "--gpu-source", "none", "--pid", str(work.pid), "--job-id", job,
                                 "--spool-dir", str(tmp_path / f"spool{n}"),
                                 "--train-socket", str(tmp_path / f"t{n}.sock")],
                                tmp_path / f"agent{n}.log"))
        targets = tmp_path / "clusterwatch-collectors.json"
        made = subprocess.run([sys.executable, "-m", "clusterwatch.prometheus_targets", "--collectors", ",".join(grpc),
                               "--metrics", ",".join(f"127.0.0.1:{c.metrics_port}" for c in collectors),
                               "-o", str(targets)], capture_output=True, text=True)
        assert made.returncode == 0, made.stderr
        for address, job in jobs.items():
            wait_for(lambda a=address, j=job: cli("status", j, "--collector", a).returncode == 0, timeout=60,
                     what=f"job {job} on {address}")
        with running_victoriametrics(tmp_path / "vm") as vm:
            shipped = SHIPPED.read_text()
            for old in ("/etc/prometheus/clusterwatch-collectors.json", "http://victoriametrics.example.org:8428/api/v1/write",
                        "scrape_interval: 15s", "scrape_timeout: 10s", "refresh_interval: 1m", "- alerts.yml"):
                assert old in shipped, old
            config = (shipped.replace("/etc/prometheus/clusterwatch-collectors.json", str(targets))
                      .replace("http://victoriametrics.example.org:8428/api/v1/write", vm.write_url)
                      .replace("scrape_interval: 15s", "scrape_interval: 1s")
                      .replace("scrape_timeout: 10s", "scrape_timeout: 1s")
                      .replace("refresh_interval: 1m", "refresh_interval: 5s")
                      .replace("- alerts.yml", f"- {ROOT / 'deploy/prometheus/alerts.yml'}")
                      .replace("    queue_config:", "    queue_config:\n      batch_send_deadline: 1s"))
            with running_prometheus(tmp_path / "prom", [], config_text=config) as prom:
                prom.wait_for_series("clusterwatch_node_up", count=2)

                def every_shard():
                    got = vm.query("count by (shard, job_id) (clusterwatch_rank_rss_bytes)")
                    return {(r["metric"].get("shard"), r["metric"].get("job_id")) for r in got}

                wait_for(lambda: every_shard() == set(jobs.items()), timeout=90,
                         what=f"each job's series from its own shard in VictoriaMetrics: {vm.log()}")
                # the cluster's own label comes along, and sums across shards count every node once
                up = vm.query('sum(clusterwatch_node_up{cluster="example"})')
                assert float(up[0]["value"][1]) == 2.0
                prom_sum = prom.query("sum(clusterwatch_node_up)")
                assert float(prom_sum[0]["value"][1]) == 2.0
    finally:
        for p in reversed(started):
            p.stop()


def test_promtool_checks_the_shipped_sharded_config():
    promtool = require_binary("promtool", "prometheus")
    out = subprocess.run([promtool, "check", "config", str(SHIPPED)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_three_shards_summed_in_prometheus_equal_one_collector_for_the_same_load(tmp_path):
    """Four nodes, three jobs (one spanning two nodes), once on three collectors (each job on its own, its
    nodes' agents streaming there) and once on one: Prometheus's counts and sums over the shards equal the
    single collector's, so series neither overlap nor go missing between shards."""
    started: list[Proc] = []
    try:
        shards = [Collector(tmp_path, name=f"s{i}", db=tmp_path / f"s{i}.db") for i in range(3)]
        single = Collector(tmp_path, name="single", db=tmp_path / "single.db")
        started += [*shards, single]
        grpc = tuple(c.address for c in shards)
        jobs: dict[str, str] = {}  # collector -> job, one job a collector
        i = 0
        while len(jobs) < 3:
            jobs.setdefault(pick(f"sum-{i}", grpc), f"sum-{i}")
            i += 1
        first = jobs[grpc[0]]
        nodes = [("sumnode0", first), ("sumnode1", first), ("sumnode2", jobs[grpc[1]]), ("sumnode3", jobs[grpc[2]])]
        for node, job in nodes:
            work = Proc([sys.executable, "-c", SLEEPER], tmp_path / f"{node}-work.log")
            started.append(work)
            for where, address in (("shard", pick(job, grpc)), ("single", single.address)):
                started.append(Proc([*CLI, "agent", "--collector", address, "--node", node, "--interval", "1",
                                     "--gpu-source", "none", "--pid", str(work.pid), "--job-id", job,
                                     "--spool-dir", str(tmp_path / f"{node}-{where}"),
                                      "--train-socket", str(tmp_path / f"{node}-{where}.sock")],
                                    tmp_path / f"{node}-{where}.log"))
        targets = tmp_path / "targets.json"
        subprocess.run([sys.executable, "-m", "clusterwatch.prometheus_targets", "--collectors", ",".join(grpc),
                        "--metrics", ",".join(f"127.0.0.1:{c.metrics_port}" for c in shards), "-o", str(targets)],
                       check=True, capture_output=True)
        config = json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{
                "job_name": "clusterwatch", "honor_labels": True,
                "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "5s"}],
                "static_configs": [{"targets": [f"127.0.0.1:{single.metrics_port}"], "labels": {"shard": "single"}}],
            }],
        })
        with running_prometheus(tmp_path / "prom", [], config_text=config) as prom:
            def value(expr: str) -> float | None:
                got = prom.query(expr)
                return float(got[0]["value"][1]) if got else None

            checks = ["sum(clusterwatch_node_up{S})", "count(clusterwatch_rank_rss_bytes{S})",
                      "count(count by (job_id) (clusterwatch_job_info{S}))",
                      'count({__name__=~"clusterwatch_(rank|node|job|gpu)_.*",S})']

            def same() -> bool:
                for expr in checks:
                    over_shards = value(expr.replace("S", 'shard!="single"'))
                    one = value(expr.replace("S", 'shard="single"'))
                    if over_shards is None or over_shards != one:
                        return False
                return value(checks[0].replace("S", 'shard="single"')) == 4.0

            try:
                wait_for(same, timeout=90, what="the shards' sums to equal the single collector's")
            except AssertionError as exc:
                seen = {e: (value(e.replace("S", 'shard!="single"')), value(e.replace("S", 'shard="single"')))
                        for e in checks}
                raise AssertionError(f"{exc}: {seen}") from None
            # and each job's ranks are all on one shard
            by_shard = prom.query('count by (job_id, shard) (clusterwatch_rank_rss_bytes{shard!="single"})')
            assert sorted((r["metric"]["job_id"], r["metric"]["shard"]) for r in by_shard) == \
                sorted((job, address) for address, job in jobs.items())
    finally:
        for p in reversed(started):
            p.stop()
