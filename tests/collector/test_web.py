"""The collector's job pages over HTTP, from a real collector fed by a real agent (tests/web_stack.py).

The browser's side (charts drawn, no script run, nothing fetched from elsewhere) is test_web_browser.py.
"""
from __future__ import annotations

import html
import json
import re

import pytest
from clusterwatch.collector.web.pages import job_page
from clusterwatch.v1 import query_pb2
from markupsafe import escape

from tests.support.helpers import Collector
from tests.web_stack import HOSTILE_ARG, HOSTILE_COMM, HOSTILE_TAG, JOB_ID, start_web_stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = start_web_stack(tmp_path_factory.mktemp("web"))
    yield s
    s.stop()


def _series(page: str, label: str, title: str) -> list[float]:
    """The figures of `label`'s line in the chart captioned `title`."""
    fig = re.search(rf"<figcaption>{re.escape(escape(title))}</figcaption>(.*?)</figure>", page, re.S)
    assert fig, f"no chart {title!r}"
    line = re.search(rf'data-label="{re.escape(label)}" data-values="([^"]*)" points="([^"]*)"', fig.group(1))
    assert line, f"no line {label!r} in {title!r}"
    assert len(line.group(2).split()) == len(line.group(1).split())
    return [float(v) for v in line.group(1).split()]


def test_the_index_lists_the_job_with_a_link(stack):
    code, page, headers = stack.get("/")
    assert code == 200 and headers["Content-Type"].startswith("text/html")
    assert f'href="/jobs/{JOB_ID}"' in page


def test_the_job_page_charts_the_figures_status_shows(stack):
    status = stack.status_json()
    code, page, _ = stack.get(f"/jobs/{JOB_ID}")
    assert code == 200
    memory = _series(page, "rank 0", "GPU memory per rank")
    (proc,) = status["processes"]
    # the chart draws every history point; status resamples the same points, keeping the first
    assert memory[0] == pytest.approx(proc["gpu_memory_trend"][0], rel=1e-6)
    assert max(memory) <= int(proc["gpu_memory_peak_bytes"]) * (1 + 1e-6)
    assert memory[-1] > memory[0]  # it leaks
    (gpu,) = status["gpus"]
    assert _series(page, f"GPU 0 on {gpu['node']}", "GPU utilisation")
    assert _series(page, "rank 0", "Steps per second per rank")
    assert max(_series(page, "rank 0", "GPU utilisation per rank")) > 0  # the steady profile keeps it busy
    assert "Power (latest)" in page
    assert 'id="badge" class="badge normal"' in page or 'class="badge warning"' in page


def test_hostile_tags_arguments_and_process_names_are_text(stack):
    _, page, headers = stack.get(f"/jobs/{JOB_ID}")
    for raw in (HOSTILE_TAG, HOSTILE_ARG, HOSTILE_COMM):
        assert raw not in page, raw
    assert escape(f"exp={HOSTILE_TAG}") in page  # the tags line, as the template engine escapes it
    # the report's command line, as status cuts it to its width: its text, unescaped, is the command's
    shown = html.unescape(re.search(r"  command: ([^\n]*?)…?\n", page).group(1))
    assert " ".join(stack.status_json()["provenance"][0]["cmdline"]).startswith(shown)
    assert "&lt;b&gt;x&lt;/b" in page  # the process table's CMD (cut to its width)
    # the one script allowed is the page's own, by its hash
    assert re.search(r"script-src 'sha256-[A-Za-z0-9+/=]+'", headers["Content-Security-Policy"])
    assert page.count("<script>") == 1


def test_a_hostile_job_name_user_and_id_are_text():
    evil = "<script>alert(1)</script>\"'&"
    view = query_pb2.JobView(now=1000.0)
    view.job.job_id, view.job.name, view.job.user, view.job.state = "1" + evil, "n" + evil, "u" + evil, "RUNNING"
    view.alerts.add(rule="r" + evil, state="firing", severity="warning", description="d" + evil)
    view.health.add(rule="gpu_xid", severity="critical", node="h" + evil, description="x" + evil, advice="a" + evil)
    page = job_page(view, "status " + evil, [], [], stored=False)
    assert "<script>alert" not in page and "\"'&<" not in page
    assert "<h2>Health events</h2>" in page
    for text in ("1" + evil, "n" + evil, "u" + evil, "d" + evil, "h" + evil, "x" + evil, "a" + evil):
        assert escape(text) in page


def test_unknown_pages_and_writes_are_refused(stack):
    assert stack.get("/jobs/no-such-job")[0] == 404
    assert stack.get("/etc/passwd")[0] == 404


def test_an_ended_job_is_shown_from_its_stored_summary(tmp_path):
    s = start_web_stack(tmp_path)
    try:
        s.rank.stop()
        import time

        from clusterwatch.agent.spool import write_event

        from clusterwatch.model import JobEvent
        write_event(str(tmp_path / "spool"), JobEvent("end", JOB_ID, time.time(), exit_code=0))
        from tests.support.helpers import wait_for

        wait_for(lambda: (v := s.status_json()) and v["job"]["end_time"], timeout=60, what="the job ended")
        s.collector.stop()
        # a new collector on the same store holds no live state of the job: only its summary
        again = Collector(tmp_path, "--web-listen", "127.0.0.1:0", db=tmp_path / "clusterwatch.db", name="again")
        try:
            port = json.loads(again.ports_file.read_text())["web"]
            s.web_port = port
            code, page, _ = s.get(f"/jobs/{JOB_ID}")
            assert code == 200, page
            assert "from the summary stored when the job ended" in page
            assert len(_series(page, "rank 0", "GPU memory per rank (the summary's trend, evenly resampled)")) >= 2
            assert escape(HOSTILE_TAG) in page and HOSTILE_TAG not in page
        finally:
            again.stop()
    finally:
        s.stop()


def test_under_munge_a_browser_sees_no_job_unless_every_user_may(tmp_path, munged):
    env = {"CLUSTERWATCH_MUNGE_SOCKET": str(munged)}
    for name in ("private", "open"):
        (tmp_path / name).mkdir()
    s = start_web_stack(tmp_path / "private", "--query-auth", "munge", "--munge-socket", str(munged), cli_env=env)
    try:
        code, page, _ = s.get(f"/jobs/{JOB_ID}")
        assert code == 403 and "not shown here" in page
        assert "root" not in page  # whose job it is is not said
        code, page, _ = s.get("/")
        assert code == 200 and f"/jobs/{JOB_ID}" not in page and "munge" in page
    finally:
        s.stop()
    s = start_web_stack(tmp_path / "open", "--query-auth", "munge", "--munge-socket", str(munged),
                        "--show-all-jobs", cli_env=env)
    try:
        assert s.get(f"/jobs/{JOB_ID}")[0] == 200
    finally:
        s.stop()


def test_the_index_lists_running_jobs_first_and_only_the_recent_ended_ones():
    from clusterwatch.collector.web.pages import MAX_ENDED_LISTED, index_page

    jobs = [query_pb2.JobInfo(job_id=f"e{i}", start_time=i, end_time=i + 1) for i in range(MAX_ENDED_LISTED + 5)]
    jobs.append(query_pb2.JobInfo(job_id="r", start_time=1))
    page = index_page(jobs, {"r": 2})
    ids = re.findall(r'href="/jobs/([^"]+)"', page)
    assert ids[0] == "r" and ids[1] == f"e{MAX_ENDED_LISTED + 4}" and len(ids) == MAX_ENDED_LISTED + 1
    assert "e0" not in ids


def test_a_loopback_page_answers_no_other_host_name(stack):
    """DNS rebinding: a site whose name resolves to 127.0.0.1 gets nothing, its name being the Host."""
    import http.client

    for host, code in (("evil.example:80", 421), ("127.0.0.1.nip.io", 421), (f"localhost:{stack.web_port}", 200),
                       (f"127.0.0.1:{stack.web_port}", 200), ("", 421)):
        conn = http.client.HTTPConnection("127.0.0.1", stack.web_port, timeout=10)
        conn.putrequest("GET", f"/jobs/{JOB_ID}", skip_host=True)
        if host:
            conn.putheader("Host", host)
        conn.endheaders()
        resp = conn.getresponse()
        body = resp.read().decode()
        conn.close()
        assert resp.status == code, (host, resp.status)
        if code == 421:
            assert JOB_ID not in body


def test_a_page_that_fails_answers_500_and_is_logged_once(caplog):
    from clusterwatch.collector.queries.auth import Caller
    from clusterwatch.collector.web.app import WebApp

    class BrokenCore:
        def live_job_view(self, job_id, points):
            raise RuntimeError("boom")

    app = WebApp(BrokenCore(), None, Caller(None, "", admin=True))
    statuses = []
    for _ in range(3):
        body = b"".join(app({"REQUEST_METHOD": "GET", "PATH_INFO": "/jobs/1"}, lambda s, h: statuses.append(s)))
        assert b"boom" not in body
    assert statuses == ["500 Internal Server Error"] * 3 and app.errors == 3
    assert len([r for r in caplog.records if "web page" in r.getMessage()]) == 1
