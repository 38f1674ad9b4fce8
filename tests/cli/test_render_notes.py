"""The report says what is known (issue 26): a leak that was still growing when a job its user or its own code
ended is not read as an out-of-memory kill, a growing trend before any alert does not send the reader to an Alerts
section that is not there, and a job without an owner says why rather than "?"."""
from __future__ import annotations

import pytest
from clusterwatch.v1 import query_pb2

from clusterwatch.report import render


def _ended_with_a_leak(state: str, exit_code: int) -> query_pb2.JobView:
    view = query_pb2.JobView(now=1000.0)
    view.job.job_id, view.job.state, view.job.start_time, view.job.end_time = "7", state, 100.0, 900.0
    view.job.exit_code = exit_code
    view.processes.add(node="n1", pid=10, command="python", alive=False, rank=3, last_seen=899.0)
    view.alerts.add(rule="host_memory_leak", state="resolved", ended_while_firing=True, node="n1", pid=10,
                    description="Host memory (RSS) of rank 3 grows 20 GiB/h")
    return view


@pytest.mark.parametrize(("state", "code", "oom"), [("COMPLETED", 0, False), ("FAILED", 137, True),
                                                    ("OUT_OF_MEMORY", 0, True)])
def test_a_leak_at_the_end_reads_as_an_oom_kill_only_where_the_job_failed(state, code, oom):
    notes = " ".join(render(_ended_with_a_leak(state, code), width=None).split("\nNotes\n", 1)[1].split())
    assert "was still growing when it ended" in notes
    assert ("out-of-memory kill" in notes) is oom, notes


def test_a_growing_gpu_memory_before_any_alert_names_the_alert_to_come():
    view = query_pb2.JobView(now=1000.0)
    view.job.job_id, view.job.state, view.job.start_time = "8", "RUNNING", 100.0
    view.processes.add(node="n1", pid=10, command="python", alive=True, rank=0, gpu_memory_bytes=30 << 30,
                       gpu_memory_peak_bytes=30 << 30, gpu_memory_trend=[float(n << 30) for n in range(10, 30)])
    text = render(view, width=None)
    assert "\nAlerts\n" not in text
    notes = " ".join(text.split("\nNotes\n", 1)[1].split())
    assert "GPU memory of rank 0 on n1 is growing; if it goes on, the gpu_memory_leak alert says" in notes
    assert "see Alerts" not in notes


@pytest.mark.parametrize(("users", "ended", "why"), [
    ((), False, "? (none of its processes sampled yet: its owner is the user they run as)"),
    ((), True, "? (no process of it was sampled: its owner is the user its processes run as)"),
    (("alice",), False, "? (its processes run as alice, as an agent that did not prove itself says)"),
    (("alice", "bob"), False, "? (its processes run as alice, bob: no one owner)"),
])
def test_a_job_without_an_owner_says_why(users, ended, why):
    view = query_pb2.JobView(now=1000.0)
    view.job.job_id, view.job.state, view.job.start_time, view.job.source = "9", "RUNNING", 100.0, "prolog"
    if ended:
        view.job.state, view.job.end_time = "COMPLETED", 900.0
    for n, user in enumerate(users):
        view.processes.add(node="n1", pid=10 + n, command="python", alive=True, user=user)
    [line] = [x for x in render(view, width=None).splitlines() if "User/Account:" in x]
    assert line == f"   User/Account: {why}"
