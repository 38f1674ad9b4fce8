"""A shared-memory leak end to end (issue 27 part 3): a real process grows a /dev/shm file with write(), never
mapping it, so its RSS stays flat; a real agent walks the node's tmpfs every second and a real collector, with
a 20 s leak window, counts the job's user's files in the job's host memory: host_memory_leak fires,
naming the tmpfs files, and `status` shows them. Before that, a look-alike: the same file filled in a burst
then held (a DataLoader's shared memory warming up), and nothing fires."""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.support.helpers import CLI, Collector, Proc, cli, firing_alert, unique_job_id, wait_for
from tests.support.short_leak_rules import WINDOW_S, short_leak_rules

pytestmark = pytest.mark.e2e
NODE = "shm-node1"
MIB = 1 << 20

# The short window's floor at 60 MiB: the file, growing 80 MiB in it at 4 MiB/s, has passed the burst's 150 MiB by
# 60 and more when the alert fires.
RULES = short_leak_rules(min_growth_mb=60)

# Appends to its /dev/shm file while the control file says "grow" (4 MiB a second), holds otherwise; a burst
# of N MiB at once when it says "burst N". Never maps the file: its pages are in no process's RSS.
WRITER = textwrap.dedent("""
    import os, sys, time
    path, control = sys.argv[1], sys.argv[2]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    chunk = b"x" * (1 << 20)
    while True:
        with open(control) as f:
            what = f.read().split()
        if what and what[0] == "burst":
            for _ in range(int(what[1])):
                os.write(fd, chunk)
            with open(control, "w") as f:
                f.write("hold")
        elif what and what[0] == "grow":
            os.write(fd, chunk)
        time.sleep(0.25)
""")


def _host_leaks(collector: Collector, job: str) -> list[dict]:
    r = cli("alerts", "--collector", collector.address, "--json", "--all")
    assert r.returncode == 0, r.stderr
    return [a for a in json.loads(r.stdout).get("alerts", [])
            if a["rule"] == "host_memory_leak" and a.get("job_id") == job]


def test_a_dev_shm_file_grown_by_write_is_a_host_memory_leak_and_a_burst_then_held_is_not(tmp_path: Path):
    job = unique_job_id()
    shm = Path("/dev/shm") / f"cw-e2e-{uuid.uuid4().hex}"
    # the writer runs as nobody: root's tmpfs files are the machine's, counted for no job (collector/state/tmpfs.py)
    shared = Path(tempfile.mkdtemp(prefix="cw-e2e-shm-"))
    shared.chmod(0o755)
    control = shared / "control"
    control.write_text("hold")
    control.chmod(0o666)  # the writer sets it back to "hold" after a burst
    (shared / "writer.py").write_text(WRITER)
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES)
    spool = tmp_path / "spool"
    spool.mkdir()
    collector = Collector(tmp_path, "--rules", str(rules))
    writer = Proc(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable,
                   str(shared / "writer.py"), str(shm), str(control)], tmp_path / "writer.log")
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", NODE, "--gpu-source", "none",
                  "--interval", "1", "--no-provenance", "--tmpfs-interval", "1", "--kmsg", "none",
                  "--spool-dir", str(spool), "--train-socket", str(spool / "train.sock"), "--job-id", job,
                  "--pid", str(writer.pid), "--send-interval", "0"], tmp_path / "agent.log")
    try:
        def status() -> dict | None:
            r = cli("status", job, "--collector", collector.address, "--json")
            return json.loads(r.stdout) if r.returncode == 0 else None

        def node_with_tmpfs() -> dict | None:
            got = status()
            nodes = [n for n in (got or {}).get("nodes", []) if n["node"] == NODE]
            return nodes[0] if nodes and nodes[0]["tmpfs_bytes"] is not None else None

        wait_for(node_with_tmpfs, timeout=60, what="the job's node with a tmpfs walk")
        # the look-alike: 150 MiB at once, then held for longer than the rule's window
        control.write_text("burst 150")
        counted = wait_for(lambda: (n := node_with_tmpfs()) and n["tmpfs_bytes"] >= 150 * MIB and n, timeout=30,
                           what="the burst counted")
        # Not a fixed sleep: the collector holds (and has judged) the node's walks to a window and a half past the
        # burst, so that the rule has looked at the step in every place of its window, and past it.
        held_to = float(counted["last_seen"]) + 1.5 * WINDOW_S
        wait_for(lambda: float(node_with_tmpfs()["last_seen"]) >= held_to, timeout=90, interval=0.5,
                 what="the burst held for a window")
        assert not _host_leaks(collector, job), "a burst then held is no leak"
        # the leak: the file grows by write(); the writer's RSS stays flat
        control.write_text("grow")
        try:
            fired = wait_for(lambda: firing_alert(collector, "host_memory_leak"), timeout=150, interval=2.0,
                             what="host_memory_leak firing")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{collector.text()[-3000:]}\n{agent.text()[-2000:]}") from None
        assert "/dev/shm" in fired["description"] and fired.get("pid") == writer.pid, fired
        node = node_with_tmpfs()
        assert node is not None and node["tmpfs_bytes"] > 200 * MIB and node["tmpfs_shared_with"] == []
        rss = (status() or {})["processes"][0]["rss_bytes"]
        assert rss < 100 * MIB, "the file is in no RSS: only the walk sees it"
        text = cli("status", job, "--collector", collector.address, env={**os.environ, "COLUMNS": "80"})
        assert text.returncode == 0, text.stderr
        assert "Shared memory" in text.stdout and "in /dev/shm and tmpfs" in text.stdout
        assert max(len(x) for x in text.stdout.splitlines()) <= 80
    finally:
        for p in (agent, writer, collector):
            p.stop()
        shm.unlink(missing_ok=True)
        shutil.rmtree(shared, ignore_errors=True)
