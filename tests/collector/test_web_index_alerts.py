"""The index's "Alerts firing" counts a job's alerts as its page's badge does: one that ended while firing (its
process died with it, never cleared) still counts, while the job runs and once it has ended.

A real collector with short training_stall rules, a real agent and a real trainer (tests/support/trainers.py) that
stops stepping: training_stall fires, then the trainer is killed.
"""
from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.error
import urllib.request

import pytest
from clusterwatch.agent.spool import write_event

from clusterwatch.model import JobEvent
from tests.support.helpers import Collector, cli, wait_for
from tests.support.trainers import start_trainer

pytestmark = pytest.mark.e2e

JOB = "index-ended"
RULES = """
[training_stall]
for_s = 2
pending_after_s = 1
take_stacks = false
"""


def _get(port: int, path: str) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.read().decode()


def _index_count(port: int) -> int | None:
    """The job's "Alerts firing" cell on the index, or None when it is not listed."""
    row = re.search(rf'<tr><td><a href="/jobs/{JOB}">.*?</tr>', _get(port, "/"))
    return int(re.findall(r"<td[^>]*>(\d+)</td>", row.group(0))[-1]) if row else None


def _page_counts(port: int) -> tuple[str, int]:
    """The job page's badge and how many of its alerts read firing or ended while firing."""
    page = _get(port, f"/jobs/{JOB}")
    level = re.search(r'id="badge" class="badge ([a-z]+)"', page).group(1)
    return level, len(re.findall(r'data-state="(?:firing|ended)"', page))


def _stall(collector: Collector) -> dict | None:
    r = cli("alerts", "--collector", collector.address, "--json", "--all")
    if r.returncode != 0:
        return None
    data = json.loads(r.stdout)
    entries = data.get("alerts", data) if isinstance(data, dict) else data
    return next((e for e in entries if e.get("job_id") == JOB and e["rule"] == "training_stall"), None)


def test_an_alert_that_ended_while_firing_is_counted_on_the_index_as_on_the_badge(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES)
    collector = Collector(tmp_path, "--web-listen", "127.0.0.1:0", "--rules", str(rules), "--rules-interval", "0.5")
    web = json.loads(collector.ports_file.read_text())["web"]
    trainer = start_trainer(tmp_path, collector.address, JOB, "stuck")
    try:
        trainer.stepping()  # training_stall judges a step that moved before
        trainer.block()
        wait_for(lambda: (a := _stall(collector)) and a["state"] == "firing", timeout=90, interval=0.5,
                 what="training_stall firing")
        assert _index_count(web) == 1 and _page_counts(web) == ("critical", 1)

        trainer.rank.stop(signal.SIGKILL)  # it dies stalled: the alert never cleared
        wait_for(lambda: (a := _stall(collector)) and a.get("ended_while_firing"), timeout=60, interval=0.5,
                 what="training_stall ended while firing")
        assert _page_counts(web) == ("critical", 1)
        assert _index_count(web) == 1, "the index leaves out the alert the badge counts"

        # once the job has ended, from its stored summary: the same
        write_event(str(trainer.spool), JobEvent("end", JOB, time.time(), os.getuid(), exit_code=137))
        wait_for(lambda: "from the summary stored when the job ended" in _get(web, f"/jobs/{JOB}"), timeout=60,
                 interval=0.5, what="the job's page from its summary")
        assert _page_counts(web) == ("critical", 1) and _index_count(web) == 1
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- collector\n{collector.text()[-2000:]}\n{trainer.logs()}") from None
    finally:
        trainer.stop()
        collector.stop()
