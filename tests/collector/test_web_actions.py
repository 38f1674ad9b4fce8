"""The job page's actions over HTTP (collector/web/actions.py, access.py): a real collector with --web-actions,
real agents and real trainers using clusterwatch.train (tests/web_stack.py). Confirmation first, then a
POST that must come from the page itself (Origin) with its token; only the job's owner or an admin, as
the proxy's header names them, may act; every request recorded with who asked.

In a real browser: test_web_actions_browser.py.
"""
from __future__ import annotations

import html
import io
import re

import pytest
from clusterwatch.collector.queries.auth import Caller, NoAuth
from clusterwatch.collector.web.access import BrowserAccess, parse_proxies
from clusterwatch.collector.web.app import WebApp

from tests.support.helpers import cli, wait_for
from tests.web_stack import (
    PROXY_SECRET,
    PROXY_SECRET_HEADER,
    RUNNING_JOB,
    STUCK_JOB,
    proxy_secret_args,
    start_actions_stack,
)

pytestmark = pytest.mark.e2e


def _token(page: str) -> str:
    found = re.search(r'name="token" value="([0-9a-f]+)"', page)
    assert found, page[:2000]
    return found.group(1)


def _checkpoints(stack) -> list[str]:
    return stack.marker.read_text().splitlines() if stack.marker.exists() else []


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    # queries unauthenticated and no proxy: the browser acts only because the collector opts in
    s = start_actions_stack(tmp_path_factory.mktemp("web-actions"), "--web-actions", "--allow-unauthenticated-actions")
    yield s
    s.stop()


def test_each_action_asks_for_confirmation_first(stack):
    code, page = stack.request(f"/jobs/{RUNNING_JOB}")
    assert code == 200 and 'id="action-diagnose"' in page and 'id="action-checkpoint"' in page
    assert 'id="action-stop"' in page
    code, page = stack.request(f"/jobs/{STUCK_JOB}/confirm?action=stop")
    assert code == 200 and 'method="post"' in page and "ends the training run" in page
    assert "<script>" not in page  # the confirmation works without JavaScript, and does not refresh itself
    assert not _checkpoints(stack)  # asking for confirmation asks nothing


def test_a_post_without_the_pages_token_or_from_another_site_is_refused(stack):
    origin = {"Origin": stack.url("")}
    code, page = stack.request(f"/jobs/{RUNNING_JOB}/confirm?action=checkpoint")
    token = _token(page)
    form = {"action": "checkpoint", "token": token}
    for data, headers, why in (
            ({"action": "checkpoint"}, origin, "token is missing"),
            ({"action": "checkpoint", "token": "0" * 64}, origin, "token is missing or is not this page"),
            (form, {"Origin": "http://evil.example"}, "another site"),
            (form, {"Origin": "null"}, "did not say which page"),
            (form, {}, "did not say which page"),
            (form, {**origin, "Sec-Fetch-Site": "cross-site"}, "another site")):
        code, page = stack.request(f"/jobs/{RUNNING_JOB}/act", data, headers)
        assert code == 403 and why in html.unescape(page), (data, headers, page)
    assert not _checkpoints(stack), "a refused request reached the process"
    # the token is the job's: another job's page's token does not do for this one
    _, other = stack.request(f"/jobs/{STUCK_JOB}/confirm?action=checkpoint")
    code, _ = stack.request(f"/jobs/{RUNNING_JOB}/act", {"action": "checkpoint", "token": _token(other)}, origin)
    assert code == 403


def test_a_confirmed_checkpoint_reaches_the_handler_and_is_recorded_with_who_asked(stack):
    _, page = stack.request(f"/jobs/{RUNNING_JOB}/confirm?action=checkpoint")
    code, page = stack.request(f"/jobs/{RUNNING_JOB}/act", {"action": "checkpoint", "token": _token(page)},
                               {"Origin": stack.url("")})
    assert code == 200, page
    assert "saved checkpoint at step" in page and "web (no authentication)" in html.unescape(page)
    assert len(_checkpoints(stack)) == 1  # the handler ran, once
    answers = stack.status_json(RUNNING_JOB)["train_answers"]
    assert [(a["kind"], a["status"], a["asked_by"]) for a in answers] == [
        ("checkpoint", "done", "web (no authentication)")]


def test_diagnose_shows_the_function_a_stuck_rank_is_blocked_in(stack):
    _, page = stack.request(f"/jobs/{STUCK_JOB}/confirm?action=diagnose&snapshot=1")
    assert "memory snapshot" in page
    code, page = stack.request(f"/jobs/{STUCK_JOB}/act", {"action": "diagnose", "token": _token(page),
                                                            "snapshot": "1"}, {"Origin": stack.url("")})
    assert code == 200, page
    stacks, snapshots = page.split("Memory snapshots")
    assert "blocked_in_collective" in stacks, page
    # the stuck rank accepts the snapshot request but never runs it (its loop is stuck): said so
    assert "memory_snapshot" in snapshots and ("accepted" in snapshots or "no answer" in snapshots), page


def test_a_page_from_a_collector_without_web_actions_is_read_only(tmp_path):
    s = start_actions_stack(tmp_path)
    try:
        code, page = s.request(f"/jobs/{RUNNING_JOB}")
        assert code == 200 and "Actions" not in page and "<form" not in page
        code, page = s.request(f"/jobs/{RUNNING_JOB}/confirm?action=checkpoint")
        assert code == 403 and "--web-actions" in page
        code, _ = s.request(f"/jobs/{RUNNING_JOB}/act", {"action": "checkpoint"}, {"Origin": s.url("")})
        assert code == 405
        assert not _checkpoints(s)
    finally:
        s.stop()


def test_behind_the_proxy_only_the_owner_acts_and_another_user_is_told_why(tmp_path):
    s = start_actions_stack(tmp_path, "--web-actions", "--web-user-header", "X-Remote-User",
                            "--web-trusted-proxy", "127.0.0.1", *proxy_secret_args(tmp_path), "--show-all-jobs")
    owner = s.status_json(RUNNING_JOB)["job"]["user"]
    origin = {"Origin": s.url(""), PROXY_SECRET_HEADER: PROXY_SECRET}  # the proxy's every request carries it
    try:
        mallory = {"X-Remote-User": "mallory", PROXY_SECRET_HEADER: PROXY_SECRET}
        code, page = s.request(f"/jobs/{RUNNING_JOB}", headers=mallory)  # shown (--show-all-jobs) ...
        assert code == 200 and "only the job's owner or an admin may act" in html.unescape(page)
        assert 'id="action-checkpoint"' not in page  # ... without its buttons
        code, page = s.request(f"/jobs/{RUNNING_JOB}/confirm?action=checkpoint", headers=mallory)
        assert code == 403 and "you are mallory" in page
        _, page = s.request(f"/jobs/{RUNNING_JOB}/confirm?action=checkpoint",
                            headers={"X-Remote-User": owner, PROXY_SECRET_HEADER: PROXY_SECRET})
        token = _token(page)
        for who in (mallory, {}):  # another user with the owner's token; the proxy naming no one
            code, page = s.request(f"/jobs/{RUNNING_JOB}/act", {"action": "checkpoint", "token": token},
                                   {**origin, **who})
            assert code == 403 and "only the job's owner or an admin may act" in html.unescape(page), (who, page)
        assert not _checkpoints(s), "a refused request reached the process"
        code, page = s.request(f"/jobs/{RUNNING_JOB}/act", {"action": "checkpoint", "token": token},
                               {**origin, "X-Remote-User": owner})
        assert code == 200 and "saved checkpoint at step" in page, page
        wait_for(lambda: _checkpoints(s), timeout=10, what="the handler's line")
        assert [a["asked_by"] for a in s.status_json(RUNNING_JOB)["train_answers"]] == [f"web user {owner}"]
    finally:
        s.stop()


def _call(app, remote: str, headers: dict, method: str = "GET", path: str = "/jobs/1") -> tuple[str, bytes]:
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "REMOTE_ADDR": remote, "wsgi.input": io.BytesIO(),
               **{"HTTP_" + k.upper().replace("-", "_"): v for k, v in headers.items()}}
    got = []
    body = b"".join(app(environ, lambda status, h: got.append(status)))
    return got[0], body


class _NoJobs:
    def live_job_view(self, job_id, points):
        return None

    def stored_job_view(self, job_id):
        return None


def test_the_proxy_header_is_refused_without_the_secret_or_from_an_address_not_configured():
    access = BrowserAccess(NoAuth(), "X-Remote-User", parse_proxies(["10.9.0.0/16"]),
                           proxy_secret=PROXY_SECRET.encode())
    app = WebApp(_NoJobs(), None, access)
    proxy = {"X-Remote-User": "root", PROXY_SECRET_HEADER: PROXY_SECRET}
    status, body = _call(app, "127.0.0.1", proxy)
    assert status == "403 Forbidden" and b"does not come from the proxy" in body
    assert access.forged == 1
    assert _call(app, "10.9.3.4", proxy)[0] == "404 Not Found"  # the proxy's: taken
    assert _call(app, "::ffff:10.9.3.4", proxy)[0] == "404 Not Found"
    for forged in ({"X-Remote-User": "root"}, {"X-Remote-User": "root", PROXY_SECRET_HEADER: PROXY_SECRET[:-1]},
                   {PROXY_SECRET_HEADER: "guess"}):
        assert _call(app, "10.9.3.4", forged)[0] == "403 Forbidden"  # the proxy's address without its secret
    assert access.forged == 4
    assert _call(app, "127.0.0.1", {})[0] == "404 Not Found"  # no header: as without a proxy
    # an address alone proves nothing: without a secret, only the pages' Unix socket is the proxy's
    by_address = BrowserAccess(NoAuth(), "X-Remote-User", parse_proxies(["127.0.0.1"]))
    assert _call(WebApp(_NoJobs(), None, by_address), "127.0.0.1", {"X-Remote-User": "root"})[0] == "403 Forbidden"


def test_who_may_act_as_access_says():
    open_access = BrowserAccess(NoAuth(), unauthenticated_actions=True)
    assert open_access.browser({}).why_not_act("alice", True) == ""  # no authentication, opted in: one user's page
    assert "--web-actions" in open_access.browser({}).why_not_act("alice", False)
    # no authentication, not opted in: nobody in particular acts on nothing, and is told the flag
    assert "--allow-unauthenticated-actions" in BrowserAccess(NoAuth()).browser({}).why_not_act("alice", True)
    proxied = BrowserAccess(NoAuth(), "X-Remote-User", parse_proxies(["127.0.0.1"]), frozenset({"ops"}),
                            proxy_secret=PROXY_SECRET.encode())
    as_user = lambda name: proxied.browser({"REMOTE_ADDR": "127.0.0.1", "HTTP_X_REMOTE_USER": name,  # noqa: E731
                                            "HTTP_X_CLUSTERWATCH_PROXY_SECRET": PROXY_SECRET})
    assert as_user("alice").why_not_act("alice", True) == ""
    assert "you are bob" in as_user("bob").why_not_act("alice", True)
    assert not as_user("bob").may_see("alice")  # behind the proxy each user sees their own jobs
    assert as_user("ops").why_not_act("alice", True) == "" and as_user("ops").may_see("alice")
    assert as_user("root").why_not_act("alice", True) == ""
    # under munge, no proxy: a browser is nobody in particular, and acts on nothing even where it sees all
    class _Munge:
        show_all = True
    seen_all = BrowserAccess(_Munge()).browser({})
    assert seen_all.may_see("alice") and "not identified" in seen_all.why_not_act("alice", True)
    assert Caller(None, "", admin=True).may_see("x")


@pytest.mark.parametrize("args, said", [
    (["--web-user-header", "X-Remote-User"], "needs a credential only the proxy has"),
    (["--web-trusted-proxy", "127.0.0.1"], "give --web-user-header and --web-proxy-secret-file too"),
    (["--web-user-header", "X-Remote-User", "--web-proxy-secret-file", "/f", "--web-trusted-proxy", "not-an-ip"],
     "--web-trusted-proxy: 'not-an-ip' is not an IP address"),
    (["--web-user-header", "X Remote", "--web-proxy-secret-file", "/f"], "give a header name"),
])
def test_the_proxy_options_say_what_is_wrong_in_one_line(args, said):
    r = cli("collector", "--web-listen", "none", "--metrics-listen", "none", "--listen", "127.0.0.1:0", *args)
    assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
