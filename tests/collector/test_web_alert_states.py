"""The job page's alerts as `status` reads them: one whose process ended while it fired reads "ended while
firing", not resolved, and counts towards the badge as a firing one does (it never cleared)."""
from __future__ import annotations

import re

from clusterwatch.collector.web.pages import badge, job_page
from clusterwatch.v1 import query_pb2


def _view(*alerts: dict) -> query_pb2.JobView:
    view = query_pb2.JobView(now=1000.0)
    view.job.job_id, view.job.state = "7", "RUNNING"
    for a in alerts:
        view.alerts.add(description="grows", since=900.0, **a)
    return view


def test_an_alert_that_ended_while_firing_reads_so_and_keeps_the_badge():
    view = _view({"rule": "gpu_memory_leak", "state": "resolved", "severity": "critical", "ended_while_firing": True})
    page = job_page(view, "", [], [], stored=False)
    alert = re.search(r'<div class="alert[^"]*" data-rule="gpu_memory_leak" data-state="([a-z]+)">(.*?)</div>', page)
    assert alert and alert.group(1) == "ended"
    assert "ENDED WHILE FIRING" in alert.group(2) and "RESOLVED" not in alert.group(2)
    assert 'id="badge" class="badge critical"' in page
    assert badge(view.alerts) == "critical"


def test_a_resolved_alert_leaves_the_badge_normal_and_reads_resolved():
    view = _view({"rule": "gpu_memory_leak", "state": "resolved", "severity": "critical"},
                 {"rule": "idle_gpu", "state": "resolved", "severity": "warning", "ended_while_firing": False})
    page = job_page(view, "", [], [], stored=False)
    assert badge(view.alerts) == "normal" and 'class="badge normal"' in page
    assert page.count("<b>RESOLVED</b>") == 2 and "ENDED" not in page


def test_ended_alerts_are_listed_after_firing_and_before_resolved_ones():
    view = _view({"rule": "a_resolved", "state": "resolved", "severity": "warning"},
                 {"rule": "b_ended", "state": "resolved", "severity": "warning", "ended_while_firing": True},
                 {"rule": "c_firing", "state": "firing", "severity": "warning"})
    page = job_page(view, "", [], [], stored=False)
    assert re.findall(r'data-rule="([a-z_]+)"', page) == ["c_firing", "b_ended", "a_resolved"]
    assert badge(view.alerts) == "warning"
