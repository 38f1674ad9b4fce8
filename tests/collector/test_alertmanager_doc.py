"""An alert as Alertmanager's v2 API takes it: labels that route and silence, bounded values, times, the link."""
from __future__ import annotations

import pytest
from clusterwatch.collector.alerting.alertmanager import alertmanager_urls, page_base_url
from clusterwatch.collector.alerting.alertmanager_doc import (
    DESCRIPTION_MAX,
    LABEL_MAX,
    document,
    label_value,
    labels,
    rfc3339,
)
from clusterwatch.collector.alerting.alerts import Alert
from clusterwatch.collector.rules.model import FIRING

from clusterwatch.errors import ConfigError


def _alert(**kw) -> Alert:
    base = dict(id=1, key="k", rule="gpu_memory_leak", state=FIRING, severity="warning", job_id="4242", node="n1",
                pid=7, start_time=1.0, gpu="GPU-1", rank=3, description="GPU memory grows 2 GiB/h",
                figures={}, started_at=1_700_000_000.0, fired_at=1_700_000_060.0, resolved_at=None,
                updated_at=1_700_000_060.0)
    return Alert(**{**base, **kw})


def test_the_labels_are_those_the_sites_prometheus_alerts_route_on():
    assert labels(_alert(), "alice") == {"alertname": "gpu_memory_leak", "severity": "warning", "job_id": "4242",
                                         "user": "alice", "node": "n1", "gpu": "GPU-1", "rank": "3",
                                         "source": "clusterwatch"}


def test_empty_labels_are_left_out_and_a_process_without_rank_is_named_by_pid():
    got = labels(_alert(job_id="", gpu="", rank=None), "")
    assert got == {"alertname": "gpu_memory_leak", "severity": "warning", "node": "n1", "rank": "pid7",
                   "source": "clusterwatch"}
    assert "rank" not in labels(_alert(rank=None, pid=-1), "")


@pytest.mark.parametrize("hostile", ['job "x"\nalertname="fake"', "a\x00b\x1b[31mc\x7f", "é" * 5000, "\udcff name"])
def test_a_hostile_value_stays_one_bounded_utf8_label_value(hostile):
    value = labels(_alert(node=hostile, job_id=hostile), hostile)["node"]
    assert len(value) <= LABEL_MAX
    assert not any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)
    value.encode("utf-8")  # no lone surrogate left: it would not encode


def test_two_long_values_alike_at_the_start_stay_two_alerts():
    a, b = "x" * 300 + "a", "x" * 300 + "b"
    assert label_value(a) != label_value(b)
    assert len(label_value(a)) <= LABEL_MAX
    assert label_value("short") == "short"


def test_the_description_and_summary_are_bounded_and_on_one_line():
    doc = document(_alert(description="line1\nline2 " + "y" * 10_000), labels(_alert(), ""), None, 1.8e9)
    assert len(doc["annotations"]["description"]) <= DESCRIPTION_MAX
    assert "\n" not in doc["annotations"]["description"]
    assert doc["annotations"]["summary"] == "gpu_memory_leak (warning) job 4242 rank 3 on n1 GPU GPU-1"


def test_times_are_rfc3339_and_a_resolution_never_ends_before_it_started():
    assert rfc3339(1_700_000_060.5) == "2023-11-14T22:14:20.500Z"
    doc = document(_alert(), labels(_alert(), ""), None, ends_at=5.0)
    assert doc["startsAt"] == doc["endsAt"] == "2023-11-14T22:14:20.000Z"  # fired_at, not started_at
    assert "generatorURL" not in doc


def test_the_link_is_the_jobs_page_and_a_job_id_no_page_has_links_the_list():
    base = "http://cw.example:8080"
    assert document(_alert(job_id="42_7"), {}, base, 2e9)["generatorURL"] == f"{base}/jobs/42_7"
    assert document(_alert(job_id='4"\n/..'), {}, base, 2e9)["generatorURL"] == f"{base}/jobs/4%22%0A%2F.."
    assert document(_alert(job_id="9" * 500), {}, base, 2e9)["generatorURL"] == f"{base}/"
    assert document(_alert(job_id=""), {}, base + "/", 2e9)["generatorURL"] == f"{base}/"


def test_the_urls_given_are_an_alertmanagers_base_or_its_api():
    assert alertmanager_urls(["http://am1:9093", "http://am2:9093/,https://am3/prefix/api/v2/alerts",
                              "http://am1:9093/"]) == (
        "http://am1:9093/api/v2/alerts", "http://am2:9093/api/v2/alerts", "https://am3/prefix/api/v2/alerts")
    assert alertmanager_urls(["http://a:1 http://b:2"]) == ("http://a:1/api/v2/alerts", "http://b:2/api/v2/alerts")
    for bad in ("am1:9093", "ftp://am1", "http://", "http://am?x=1"):
        with pytest.raises(ConfigError, match="--alertmanager"):
            alertmanager_urls([bad])


def test_the_pages_base_is_reachable_from_elsewhere():
    assert page_base_url("10.0.0.5", 8080) == "http://10.0.0.5:8080"
    assert page_base_url("::1", 8080) == "http://[::1]:8080"
    assert "0.0.0.0" not in page_base_url("0.0.0.0", 8080)
