"""`clusterwatch agent --collector a,b`: a stream to each collector the node has data for; a bad list is one line."""
from __future__ import annotations

import re
import sys

import pytest

from clusterwatch.shards import pick
from tests.support.helpers import CLI, Collector, Proc, cli, wait_for

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("value, message", [
    ("127.0.0.1:50051,,127.0.0.1:50052", "has an empty entry"),
    ("127.0.0.1:50051,127.0.0.1:50051", "twice"),
    ("127.0.0.1:50051,127.0.0.1", "--collector"),
])
def test_a_malformed_list_is_one_line_and_exit_2(tmp_path, value, message):
    r = cli("agent", "--collector", value, "--gpu-source", "none", "--node", "n",
            "--spool-dir", str(tmp_path / "s"), "--interval", "0.2", timeout=30)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and message in lines[0], r.stderr


def test_a_bad_collectors_before_is_one_line(tmp_path):
    r = cli("agent", "--collector", "127.0.0.1:50051", "--collectors-before", "soon=127.0.0.1:50052",
            "--gpu-source", "none", "--node", "n", "--spool-dir", str(tmp_path / "s"), timeout=30)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "JOB=HOST:PORT" in lines[0], r.stderr


@pytest.mark.parametrize("from_file", [False, True], ids=["flag", "config-file"])
def test_a_list_streams_a_job_to_its_collector_and_the_node_to_its_own(tmp_path, from_file):
    """Two collectors; a node whose own collector is the first, a job of the second: both get a stream.
    The list from --collector, or from the config file's top-level collectors = [...]."""
    collectors = [Collector(tmp_path, name=f"l{i}", db=tmp_path / f"l{i}.db") for i in range(2)]
    work = Proc([sys.executable, "-c", "import time; time.sleep(600)"], tmp_path / "work.log")
    started = [*collectors, work]
    try:
        addresses = tuple(c.address for c in collectors)
        node = next(f"ln{i}" for i in range(1000) if pick(f"ln{i}", addresses) == addresses[0])
        job = next(f"lj{i}" for i in range(1000) if pick(f"lj{i}", addresses) == addresses[1])
        if from_file:
            config = tmp_path / "config.toml"
            config.write_text(f"collectors = {list(addresses)!r}\n".replace("'", '"'))
            given = ["--config", str(config), "agent"]
        else:
            given = ["agent", "--collector", ",".join(addresses)]
        agent = Proc([*CLI, *given, "--node", node, "--gpu-source", "none",
                      "--pid", str(work.pid), "--job-id", job, "--interval", "0.3", "--send-interval", "0",
                      "--train-socket", "", "--spool-dir", str(tmp_path / "spool")], tmp_path / "agent.log")
        started.append(agent)
        wait_for(lambda: cli("status", job, "--collector", addresses[1]).returncode == 0, timeout=60,
                 what="the job on its collector")
        assert cli("status", job, "--collector", addresses[0]).returncode == 1  # not on the node's
        assert agent.stop() == 0, agent.text()
        lines = dict(re.findall(r"collector (\S+): (samples_sent=\d+ samples_acked=\d+ samples_dropped=\d+)",
                                agent.text()))
        assert set(lines) == set(addresses), agent.text()
        sent, acked, dropped = map(int, re.findall(r"=(\d+)", lines[addresses[1]]))
        assert sent > 0 and acked == sent and dropped == 0, lines
    finally:
        for p in reversed(started):
            p.stop()


def test_a_job_below_collectors_before_streams_to_the_collector_it_started_on(tmp_path):
    """The list grew from [A] to [A, B]; a job numbered below the new list's first job stays on A though the
    new list picks B for it."""
    collectors = [Collector(tmp_path, name=f"b{i}", db=tmp_path / f"b{i}.db") for i in range(2)]
    work = Proc([sys.executable, "-c", "import time; time.sleep(600)"], tmp_path / "bwork.log")
    started = [*collectors, work]
    try:
        old, new = collectors[0].address, collectors[1].address
        job = next(str(j) for j in range(3000, 4000) if pick(str(j), (old, new)) == new)
        agent = Proc([*CLI, "agent", "--collector", f"{old},{new}", "--collectors-before", f"{int(job) + 1}={old}",
                      "--node", "bnode", "--gpu-source", "none", "--pid", str(work.pid), "--job-id", job,
                      "--interval", "0.3", "--send-interval", "0", "--train-socket", "",
                      "--spool-dir", str(tmp_path / "bspool")], tmp_path / "bagent.log")
        started.append(agent)
        wait_for(lambda: cli("status", job, "--collector", old).returncode == 0, timeout=60,
                 what="the job on the collector it started on")
        assert cli("status", job, "--collector", new).returncode == 1
        both = cli("status", job, "--collector", f"{old},{new}", "--collectors-before", f"{int(job) + 1}={old}")
        assert both.returncode == 0, both.stderr  # the CLI agrees with the agent
    finally:
        for p in reversed(started):
            p.stop()
