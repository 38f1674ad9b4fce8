"""An alert's figures stay current while it fires, and a process that dies while leaking is "ended while
firing" with its last figures (issue 17, item 6): a real leaking process under a real agent and collector,
read through `alerts --json` and `status` as a user would."""
from __future__ import annotations

import json
import re
import signal
import sys

import pytest

from tests.support.helpers import CLI, Collector, Proc, cli, wait_for
from tests.support.short_leak_rules import short_leak_rules

pytestmark = pytest.mark.e2e

# 5 MiB/s, at most 1.2 GiB: a 20 s window fires on it within half a minute
LEAKER = """
import time
hoard = []
for i in range(1200):
    block = bytearray(1024 * 1024)
    block[::4096] = b"x" * len(block[::4096])
    hoard.append(block)
    time.sleep(0.2)
time.sleep(600)
"""


def _seconds(description: str) -> int | None:
    """The "grows ... for N s|min" figure of a leak alert's text, in seconds."""
    m = re.search(r" for (\d+) (s|min)\b", description)
    if m is None:
        return None
    return int(m.group(1)) * (60 if m.group(2) == "min" else 1)


def _alert(collector, rule: str) -> dict | None:
    r = cli("alerts", "--collector", collector.address, "--json", "--all")
    if r.returncode != 0:
        return None
    for entry in json.loads(r.stdout).get("alerts", []):
        if entry["rule"] == rule:
            return entry
    return None


def test_leak_alert_figures_follow_the_leak_and_the_death_of_its_process(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text(short_leak_rules())
    collector = Collector(tmp_path, "--rules", str(rules), "--history-step", "0")
    leaker = Proc([sys.executable, "-c", LEAKER], tmp_path / "leaker.log")
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "leak-node", "--interval", "0.5",
                  "--send-interval", "0",
                  "--gpu-source", "none", "--pid", str(leaker.pid), "--job-id", "leak-2", "--no-provenance",
                  "--spool-dir", str(tmp_path / "spool"), "--train-socket", str(tmp_path / "train.sock")],
                 tmp_path / "agent.log")
    try:
        first = wait_for(lambda: (a := _alert(collector, "host_memory_leak")) and a["state"] == "firing" and a,
                         timeout=150, what="host_memory_leak firing")
        grown_for = _seconds(first["description"])
        assert grown_for is not None, first["description"]
        assert re.search(r"\d (MiB|GiB)/h", first["description"]), first["description"]  # IEC units

        # while it fires, its text follows the leak: the time it has grown counts on
        later = wait_for(lambda: (a := _alert(collector, "host_memory_leak")) and a["state"] == "firing"
                         and (_seconds(a["description"]) or 0) >= grown_for + 20 and a,
                         timeout=90, what=f"the alert's text past 'for {grown_for} s' + 20 s")
        status = cli("status", "leak-2", "--collector", collector.address)
        assert status.returncode == 0, status.stderr
        # the same alert, its rate as live: re-estimated at each evaluation, so it may have moved a tenth
        # between the two reads (a loaded machine makes them seconds apart); status wraps the text where the
        # pid's digits and the figures put the line's end, so read as one line
        who = later["description"].split(" grows ")[0]
        flat = " ".join(status.stdout.split())
        assert re.search(re.escape(who) + r" grows \d+(\.\d)? (MiB|GiB)/h", flat), (who, status.stdout)
        notes = status.stdout.split("\nNotes\n", 1)
        assert len(notes) == 2, status.stdout
        notes = " ".join(notes[1].split())
        assert "Host memory of pid" in notes and "keeps growing" in notes, notes

        # the process dies while leaking: not good news, and the last figures stay
        leaker.stop(signal.SIGKILL)
        ended = wait_for(lambda: (a := _alert(collector, "host_memory_leak")) and a["state"] == "resolved" and a,
                         timeout=60, what="the alert closed once its process is gone")
        assert "ended while firing" in ended["description"], ended["description"]
        assert re.search(r"grows \d+(\.\d)? (MiB|GiB)/h for \d+ (s|min)", ended["description"]), ended
        assert ended.get("ended_while_firing") is True
        status = cli("status", "leak-2", "--collector", collector.address)
        line = next(x for x in status.stdout.splitlines() if "host_memory_leak" in x and "Alerts" not in x)
        assert "ENDED" in line and "RESOLVED" not in line, status.stdout
        notes = " ".join(status.stdout.split("\nNotes\n", 1)[1].split())
        assert "was still growing when it ended" in notes, status.stdout
    finally:
        for p in (agent, leaker, collector):
            p.stop()
