"""Job names, commands, tags and paths come from users: the CLI never writes their control characters raw.

An escape sequence in a job name (`sbatch -J $'\\e]0;...\\a'`) would otherwise retitle the window, clear
the screen or hide lines of the report of whoever runs `clusterwatch status` or `jobs` on it.
"""
from __future__ import annotations

import json
import re
import sys
import textwrap

import pytest
from clusterwatch.cli.alerts_cmd import render_alerts
from clusterwatch.v1 import query_pb2

from clusterwatch.report import render, render_jobs
from clusterwatch.report.text import printable
from tests.support.helpers import cli

pytestmark = pytest.mark.e2e

HOSTILE = "\x1b]0;owned\x07\x1b[2J\x1b[31m\r\n\x9b1m\u202eevil\x00"
# anything but the newlines and the text itself: what a terminal would act on
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def hostile_view() -> query_pb2.JobView:
    view = query_pb2.JobView(now=1000.0)
    view.job.job_id = "4242" + HOSTILE
    view.job.name = "train" + HOSTILE
    view.job.user = "mallory" + HOSTILE
    view.job.account = "acct" + HOSTILE
    view.job.partition = "gpu" + HOSTILE
    view.job.state = "RUNNING"
    view.job.start_time = 400.0
    view.job.nodes.extend(["n1" + HOSTILE])
    view.job.note = "note" + HOSTILE
    view.tags["exp" + HOSTILE] = "lr" + HOSTILE
    view.nodes.add(node="n1" + HOSTILE, agent_up=True)
    view.processes.add(node="n1" + HOSTILE, pid=7, command="py" + HOSTILE, alive=True, rank=0,
                       rss_bytes=1 << 30, mapped_by="tree" + HOSTILE)
    view.gpus.add(node="n1" + HOSTILE, index=0, name="H100" + HOSTILE, utilization=50.0)
    view.alerts.add(rule="host_memory_leak", state="firing", description="grows" + HOSTILE, node="n1" + HOSTILE)
    view.provenance_json = json.dumps([{
        "node": "n1", "pid": 7, "code_id": "x", "cmdline": ["python", "train.py" + HOSTILE],
        "git": {"commit": "abc", "branch": "main" + HOSTILE, "root": "/home/m/" + HOSTILE, "dirty": False},
    }])
    return view


def test_printable_shows_control_characters_escaped():
    assert printable("plain text, ünïcödé") == "plain text, ünïcödé"
    assert printable("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert printable("a\nb\tc\x7f\x9b") == "a\\x0ab\\x09c\\x7f\\x9b"
    assert printable("\u202eevil") == "\\u202eevil"


def test_the_report_of_a_hostile_job_holds_no_control_character():
    text = render(hostile_view(), width=None)  # the header whole, on one line
    assert not CONTROL.findall(text), CONTROL.findall(text)
    lines = text.splitlines()
    # the injected newlines stay inside their line: the header is one line, whatever the name holds
    (header,) = [x for x in lines if "clusterwatch · job" in x]
    assert "train\\x1b]0;owned\\x07" in header and "\\x0a" in header
    for seen in ("mallory\\x1b", "exp\\x1b", "py\\x1b", "H100\\x1b", "grows\\x1b", "main\\x1b",
                 "train.py\\x1b", "tree\\x1b"):
        assert seen in text, seen


def test_the_job_list_and_the_alert_list_hold_no_control_character():
    view = hostile_view()
    text = render_jobs([view.job], {view.job.job_id: 1}, 1000.0)
    assert not CONTROL.findall(text) and "train\\x1b" in text
    entry = query_pb2.AlertEntry(job_id=view.job.job_id, alert=view.alerts[0])
    text = render_alerts([entry], 1000.0)
    assert not CONTROL.findall(text) and "grows\\x1b" in text and "4242\\x1b" in text


def test_run_prints_a_hostile_command_name_argument_and_tag_escaped(tmp_path):
    # the process names itself with escapes (its comm, what the process table shows), and tags itself
    script = tmp_path / "hostile.py"
    script.write_text(textwrap.dedent(f"""
        import ctypes, time
        from clusterwatch import train
        ctypes.CDLL(None).prctl(15, b"\\x1b]0;t\\x07\\x1b[2J", 0, 0, 0)  # PR_SET_NAME
        train.tags(exp={HOSTILE!r})
        for step in range(1, 30):
            train.report(step=step)
            time.sleep(0.1)
    """))
    r = cli("run", "--interval", "0.5", "--gpu-source", "none", "--status-every", "1", "--",
            sys.executable, str(script), "arg\x1b[5m", timeout=90)
    assert r.returncode == 0, r.stderr
    assert "clusterwatch · job local-" in r.stderr
    assert not CONTROL.findall(r.stderr), CONTROL.findall(r.stderr)
    assert "arg\\x1b[5m" in r.stderr  # the watching line and the command line
    assert "\\x1b]0;t" in r.stderr  # the process table's CMD (cut at 10 characters)
    assert "exp=\\x1b]0;owned" in r.stderr  # the tags
