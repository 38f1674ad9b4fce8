"""The query commands over several real collectors: a job's own commands ask its collector, lists ask all."""
from __future__ import annotations

import json
import sys

import pytest

from clusterwatch.shards import pick
from tests.support.helpers import CLI, Collector, Proc, cli, metric_value, wait_for

pytestmark = pytest.mark.e2e

SLEEPER = "import time; time.sleep(600)"


def jobs_one_each(collectors: tuple[str, ...]) -> dict[str, str]:
    """A job id for each collector: collector → job id that rendezvous hashing gives it."""
    found: dict[str, str] = {}
    i = 0
    while len(found) < len(collectors):
        job = f"shard-{i}"
        found.setdefault(pick(job, collectors), job)
        i += 1
    return found


@pytest.fixture
def sharded(tmp_path):
    started: list[Proc] = []
    try:
        collectors = [Collector(tmp_path, name=f"c{i}", db=tmp_path / f"c{i}.db") for i in range(3)]
        started += collectors
        addresses = tuple(c.address for c in collectors)
        jobs = jobs_one_each(addresses)
        by_address = {c.address: c for c in collectors}
        for n, (address, job) in enumerate(jobs.items()):
            work = Proc([sys.executable, "-c", SLEEPER], tmp_path / f"work{n}.log")
            started.append(work)
            started.append(Proc([*CLI, "agent", "--collector", address, "--node", f"node{n}", "--interval", "0.5",
                                 "--gpu-source", "none", "--pid", str(work.pid), "--job-id", job,
                                 "--spool-dir", str(tmp_path / f"spool{n}"),
                                 "--train-socket", str(tmp_path / f"t{n}.sock")],
                                tmp_path / f"agent{n}.log"))
        # the same job id seen by a second collector too (an agent of an older list): `jobs` shows it once
        twin_job, twin_address = jobs[addresses[0]], addresses[1]
        work = Proc([sys.executable, "-c", SLEEPER], tmp_path / "work-twin.log")
        started.append(work)
        started.append(Proc([*CLI, "agent", "--collector", twin_address, "--node", "node-twin", "--interval", "0.5",
                             "--gpu-source", "none", "--pid", str(work.pid), "--job-id", twin_job,
                             "--spool-dir", str(tmp_path / "spool-twin"),
                             "--train-socket", str(tmp_path / "twin.sock")],
                             tmp_path / "agent-twin.log"))
        for address, job in [*jobs.items(), (twin_address, twin_job)]:
            wait_for(lambda a=address, j=job: cli("status", j, "--collector", a).returncode == 0, timeout=60,
                     what=f"job {job} on {address}")
        yield by_address, addresses, jobs
    finally:
        for p in reversed(started):
            p.stop()


def test_status_and_record_ask_the_jobs_collector_lists_ask_all(sharded, tmp_path):
    by_address, addresses, jobs = sharded
    everyone = ",".join(addresses)
    for address, job in jobs.items():
        doc = cli("status", job, "--collector", everyone, "--json")
        assert doc.returncode == 0, doc.stderr
        assert json.loads(doc.stdout)["job"]["job_id"] == job
        other = next(a for a in addresses if a != address and a != addresses[1])
        # only its own collector holds it: asking another alone is "not found"
        assert cli("status", job, "--collector", other).returncode == 1
        out = tmp_path / f"{job}.trace"
        rec = cli("record", job, "--collector", everyone, "-o", str(out))
        assert rec.returncode == 0, rec.stderr
        assert out.read_text().strip()
        alerts = cli("alerts", "--job", job, "--collector", everyone, "--json")
        assert alerts.returncode == 0, alerts.stderr

    listed = cli("jobs", "--collector", everyone, "--json")
    assert listed.returncode == 0, listed.stderr
    ids = [j["job_id"] for j in json.loads(listed.stdout)["jobs"]]
    assert sorted(ids) == sorted(jobs.values())  # every shard's job, the twin once

    merged = cli("alerts", "--collector", everyone, "--json")
    assert merged.returncode == 0, merged.stderr


def test_a_collector_down_lists_the_others_and_says_so(sharded):
    by_address, addresses, jobs = sharded
    by_address[addresses[2]].stop()
    listed = cli("jobs", "--collector", ",".join(addresses), "--json")
    assert listed.returncode == 1
    assert f"the collector at {addresses[2]} does not answer" in listed.stderr
    assert "Traceback" not in listed.stderr
    ids = {j["job_id"] for j in json.loads(listed.stdout)["jobs"]}
    assert ids == {jobs[addresses[0]], jobs[addresses[1]]}
    down = cli("status", jobs[addresses[2]], "--collector", ",".join(addresses))
    assert down.returncode == 1 and f"the collector at {addresses[2]} does not answer" in down.stderr


@pytest.mark.parametrize("value, message", [
    ("127.0.0.1:1,,127.0.0.1:2", "has an empty entry"),
    ("127.0.0.1:1,127.0.0.1:1", "twice"),
    ("127.0.0.1:1,127.0.0.1", "--collector"),
])
def test_a_bad_list_is_one_line(value, message):
    for args in (["status", "42"], ["jobs"], ["alerts"], ["record", "42", "-o", "/dev/null"]):
        got = cli(*args, "--collector", value)
        assert got.returncode == 2 and message in got.stderr and "Traceback" not in got.stderr, (args, got.stderr)


def test_merged_alerts_active_first_newest_first_a_shared_one_once_at_most_limit():
    from clusterwatch.cli.alerts_cmd import merge_alerts
    from clusterwatch.v1 import query_pb2

    def entry(job, rule, state, since, node="n1"):
        return query_pb2.AlertEntry(job_id=job, alert=query_pb2.AlertView(rule=rule, state=state, since=since,
                                                                           node=node))
    a = [entry("1", "leak", "resolved", 50), entry("", "agent_down", "firing", 10)]
    b = [entry("2", "stall", "firing", 30), entry("", "agent_down", "firing", 10)]
    got = merge_alerts(a + b, limit=10)
    assert [(e.job_id, e.alert.rule) for e in got] == [("2", "stall"), ("", "agent_down"), ("1", "leak")]
    assert len(merge_alerts(a + b, limit=2)) == 2


def test_a_collector_killed_and_restarted_loses_nothing_and_its_job_returns(tmp_path):
    import re
    import signal
    import time

    started: list[Proc] = []
    try:
        collectors = [Collector(tmp_path, name=f"r{i}", db=tmp_path / f"r{i}.db") for i in range(2)]
        started += collectors
        addresses = tuple(c.address for c in collectors)
        jobs = jobs_one_each(addresses)
        agents = {}
        for n, (address, job) in enumerate(jobs.items()):
            work = Proc([sys.executable, "-c", SLEEPER], tmp_path / f"rwork{n}.log")
            started.append(work)
            agents[address] = Proc([*CLI, "agent", "--collector", address, "--node", f"rnode{n}", "--interval", "0.5",
                                    "--gpu-source", "none", "--pid", str(work.pid), "--job-id", job,
                                    "--spool-dir", str(tmp_path / f"rspool{n}"),
                                    "--train-socket", str(tmp_path / f"r{n}.sock")],
                                    tmp_path / f"ragent{n}.log")
            started.append(agents[address])
        everyone = ",".join(addresses)
        victim = collectors[1]
        job = jobs[victim.address]
        wait_for(lambda: cli("status", job, "--collector", everyone).returncode == 0, timeout=60, what="the job")
        victim.stop(signal.SIGKILL)
        time.sleep(8)  # the agent buffers meanwhile
        assert cli("status", job, "--collector", everyone).returncode == 1
        port = victim.grpc_port
        back = Collector(tmp_path, name="r1-again", db=tmp_path / "r1.db", listen=f"127.0.0.1:{port}")
        started.append(back)
        wait_for(lambda: cli("status", job, "--collector", everyone).returncode == 0, timeout=90,
                 what="the restarted collector's job")
        # the job is back from the store at once; the agent's kept batches come when its backoff (up to 30 s)
        # next tries: waited for, or a loaded machine stops the agent before and its flush finds none acked
        wait_for(lambda: (metric_value(back.metrics(), "clusterwatch_ingest_samples_total") or 0) > 0, timeout=90,
                 what="the agent's kept batches at the restarted collector")
        listed = cli("jobs", "--collector", everyone, "--json")
        assert listed.returncode == 0 and {j["job_id"] for j in json.loads(listed.stdout)["jobs"]} == set(jobs.values())
        agent = agents[victim.address]
        assert agent.stop() == 0
        counts = dict(re.findall(r"samples_(sent|acked|dropped)=(\d+)", agent.text()))
        assert counts["dropped"] == "0" and counts["acked"] == counts["sent"] and int(counts["sent"]) > 0, counts
    finally:
        for p in reversed(started):
            p.stop()


def test_collectors_before_keeps_an_older_job_on_the_list_it_started_on(tmp_path):
    from tests.services.procs import refused_port

    with refused_port() as port:
        collector = Collector(tmp_path, name="old")
        added = f"127.0.0.1:{port}"  # the new collector of the list, not running: asking it fails
        new_list = (collector.address, added)
        job = next(str(j) for j in range(5000, 6000) if pick(str(j), new_list) == added)
        work = Proc([sys.executable, "-c", SLEEPER], tmp_path / "owork.log")
        agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "onode", "--interval", "0.5",
                      "--gpu-source", "none", "--pid", str(work.pid), "--job-id", job,
                      "--spool-dir", str(tmp_path / "ospool"), "--train-socket", str(tmp_path / "o.sock")],
                      tmp_path / "oagent.log")
        try:
            wait_for(lambda: cli("status", job, "--collector", collector.address).returncode == 0, timeout=60,
                     what="the job")
            new_only = cli("status", job, "--collector", ",".join(new_list))
            assert new_only.returncode == 1 and f"the collector at {added} does not answer" in new_only.stderr
            kept = cli("status", job, "--collector", ",".join(new_list), "--collectors-before",
                       f"{int(job) + 1}={collector.address}", "--json")
            assert kept.returncode == 0, kept.stderr
            assert json.loads(kept.stdout)["job"]["job_id"] == job
            # the same from the config file's top-level keys
            config = tmp_path / "config.toml"
            config.write_text(f'collectors = ["{collector.address}", "{added}"]\n'
                              f'collectors_before = {{ job = {int(job) + 1}, collectors = ["{collector.address}"] }}\n')
            from_file = cli("--config", str(config), "status", job)
            assert from_file.returncode == 0, from_file.stderr
        finally:
            for p in (agent, work, collector):
                p.stop()
