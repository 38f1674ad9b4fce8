"""The pages' WSGI app: routes, who may see which job and act on it (access.py), and the answer's headers.

GET and HEAD for the pages; with actions on (--web-actions), GET /jobs/ID/confirm?action=A asks for
confirmation and POST /jobs/ID/act does it (actions.py: the Origin and the page's token checked).
"""
from __future__ import annotations

import logging
import time
from urllib.parse import parse_qs, unquote

from ..queries.auth import Caller
from ..state.store import web_token_secret
from .access import FixedAccess
from .action_pages import actions_section, confirm_page, outcome_page, refused_page
from .actions import ACTIONS, MAX_FORM, Tokens, run_action, why_not_same_site
from .history import live_history, stored_history
from .job_charts import DEFAULT_RANGE, RANGES
from .pages import REFRESH_JS_HASH, counts_as_firing, index_page, job_page, listed, message_page

log = logging.getLogger("clusterwatch.collector")

# Nothing from elsewhere, no inline script but the page's own (by hash), no framing, forms only to itself.
CSP = (f"default-src 'none'; script-src '{REFRESH_JS_HASH}'; style-src 'unsafe-inline'; connect-src 'self'; "
       "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
TREND_POINTS = 200


def _host_name(host: str) -> str:
    """The name in a Host header, without its port ("[::1]:9752" → "::1")."""
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def is_loopback(host: str) -> bool:
    """Whether a listen host is a loopback address (the web server's own, not a client's)."""
    import ipaddress

    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


class WebApp:
    """The pages for one collector.

    Args:
        core: the collector core (views, job lists, history).
        alerts: the alert source (alerting.Alerting), or None.
        access: who each request's browser is (access.BrowserAccess), or one Caller for every request.
        loopback: served on loopback only: a request must name a loopback host. A web site the user
            visits could otherwise read the pages through DNS rebinding (its own name resolving to
            127.0.0.1), the browser sending its name as Host.
        asks: the collector's TrainAsks (train_asks.py) when the pages may act (--web-actions); None:
            read-only.
        loop: the collector's event loop, where asks runs.
    """

    def __init__(self, core, alerts, access, loopback: bool = False, asks=None, loop=None) -> None:
        self.core = core
        self.alerts = alerts
        self.access = FixedAccess(access) if isinstance(access, Caller) else access
        self.loopback = loopback
        self.asks = asks
        self.loop = loop
        # the key beside the store: a confirmation page opened before a restart works after it (a stand-in
        # core without a config, in tests: a key of its own)
        config = getattr(core, "config", None)
        self.tokens = Tokens(web_token_secret(config.db_path) if config is not None else None)
        self.errors = 0
        self.refused_actions = 0  # actions refused (cross-site, no token, not the owner): counted, not logged

    @property
    def actions_on(self) -> bool:
        return self.asks is not None and self.loop is not None

    def __call__(self, environ, start_response):
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO", "/")
        posting = method == "POST" and self.actions_on and path.startswith("/jobs/") and path.endswith("/act")
        if method not in ("GET", "HEAD") and not posting:
            allow = "GET, HEAD, POST" if self.actions_on else "GET, HEAD"
            return self._send(start_response, "405 Method Not Allowed", message_page(
                "Not allowed", "These pages take a POST only from a job's action confirmation."
                if self.actions_on else "These pages are read-only."), [("Allow", allow)])
        if self.loopback and not is_loopback(_host_name(environ.get("HTTP_HOST", ""))):
            return self._send(start_response, "421 Misdirected Request", message_page(
                "Not served", "These pages answer only to a loopback address (http://127.0.0.1:PORT/)."))
        if path == "/favicon.ico":  # browsers ask for it whatever the page says; there is none
            start_response("204 No Content", [("Cache-Control", "max-age=86400")])
            return [b""]
        browser = self.access.browser(environ)
        if browser.refused:
            return self._send(start_response, "403 Forbidden", message_page("Refused", browser.refused))
        try:
            if posting:
                status, body = self.act(unquote(path[len("/jobs/"):-len("/act")]), environ, browser)
            else:
                status, body = self.route(path, browser, environ.get("QUERY_STRING", ""))
        except Exception:  # a page that cannot be built must not take the collector's thread with it
            self.errors += 1  # said once with its traceback, then counted: a refreshing page asks every 15 s
            if self.errors == 1:
                log.exception("web page %r failed (later failures are counted, not logged)", path[:200])
            status, body = "500 Internal Server Error", message_page("Error", "This page could not be built; "
                                                                     "the collector's log says why.")
        return self._send(start_response, status, body if method != "HEAD" else "")

    def route(self, path: str, browser, query: str = "") -> tuple[str, str]:
        if path in ("/", "/jobs", "/jobs/"):
            return "200 OK", self.index(browser)
        if path.startswith("/jobs/") and path.endswith("/confirm"):
            return self.confirm(unquote(path[len("/jobs/"):-len("/confirm")]), browser, parse_qs(query))
        if path.startswith("/jobs/"):
            return self.job(unquote(path[len("/jobs/"):]), browser, parse_qs(query))
        return "404 Not Found", message_page("Not found", "No such page: try / for the jobs.")

    def index(self, browser) -> str:
        jobs = listed(self.core.job_infos(True, browser.may_see))
        firing: dict[str, int] = {}
        if self.alerts is not None:
            # what each job's page shows of its alerts, counted as its badge counts them: an alert that ended
            # while firing (its process took it along) still counts; one query a listed job, on its index
            for job in jobs:
                n = sum(1 for view in self.alerts.alert_views(job.job_id) if counts_as_firing(view))
                if n:
                    firing[job.job_id] = n
        note = "" if browser.caller.admin or browser.user else (
            "This collector identifies its users with munge, which a browser cannot present: no job is shown "
            "here. Use clusterwatch status JOBID, or ask the operator about --show-all-jobs.")
        return index_page(jobs, firing, note)

    @staticmethod
    def _not_shown(job_id: str) -> tuple[str, str]:
        # as the query service: whose it is is not named
        return "403 Forbidden", message_page(
            "Not shown", f"Job {job_id} is not shown here: this collector shows each user only their own "
            "jobs, and this browser is not known as its owner. Use clusterwatch status " + job_id + ".")

    def job(self, job_id: str, browser, query: dict | None = None) -> tuple[str, str]:
        view = self.core.live_job_view(job_id, TREND_POINTS)
        stored = view is None
        if stored:
            view = self.core.stored_job_view(job_id)
        if view is None:
            return "404 Not Found", message_page("Unknown job", f"Job {job_id} is unknown to this collector.")
        if not browser.may_see(view.job.user):
            return self._not_shown(job_id)
        if not stored and self.alerts is not None:
            view.alerts.extend(self.alerts.alert_views(job_id))
            health = getattr(self.alerts, "health_views", None)  # the GPU health findings on the job's GPUs
            if health is not None:
                view.health.extend(health(job_id))
        history = None if stored else live_history(self.core, job_id)
        ranks, gpus = history if history is not None else stored_history(view)
        actions = actions_section(job_id, browser.why_not_act(view.job.user, True), True) \
            if self.actions_on and not stored else ""
        range_key = ((query or {}).get("range") or [DEFAULT_RANGE])[0]
        if range_key not in dict((k, s) for k, _, s in RANGES):
            range_key = DEFAULT_RANGE  # a hand-typed range the page does not offer shows all
        return "200 OK", job_page(view, _status_text(view), ranks, gpus, stored, actions, range_key)

    def _refuse(self, job_id: str, why: str, status: str = "403 Forbidden") -> tuple[str, str]:
        self.refused_actions += 1
        return status, refused_page(job_id, why)

    def _actionable(self, job_id: str, browser):
        """(the job's live view, None) when this browser may act on it, else (None, the refusal's answer)."""
        if not self.actions_on:
            return None, self._refuse(job_id, browser.why_not_act("", False))
        view = self.core.live_job_view(job_id, 2)  # train_asks.targets reads its processes
        if view is None:
            known = self.core.stored_job_view(job_id) is not None
            return None, self._refuse(job_id, f"job {job_id} is not running on this collector: only a running "
                                      "job's processes can be asked" if known else
                                      f"job {job_id} is unknown to this collector", "404 Not Found")
        if not browser.may_see(view.job.user):
            self.refused_actions += 1
            return None, self._not_shown(job_id)
        why = browser.why_not_act(view.job.user, True)
        if why:
            return None, self._refuse(job_id, why)
        return view, None

    def confirm(self, job_id: str, browser, query: dict) -> tuple[str, str]:
        action = (query.get("action") or [""])[0]
        if action not in ACTIONS:
            return "400 Bad Request", message_page("Unknown action", f"One of: {', '.join(ACTIONS)}.")
        view, refused = self._actionable(job_id, browser)
        if refused is not None:
            return refused
        snapshot = (query.get("snapshot") or [""])[0] == "1"
        return "200 OK", confirm_page(job_id, view.job.name, action, snapshot,
                                      self.tokens.make(browser.user, job_id))

    def act(self, job_id: str, environ, browser) -> tuple[str, str]:
        """A confirmed action's POST: from these pages, with the page's token, by the owner or an admin."""
        why = why_not_same_site(environ, browser.via_proxy)
        if why:
            return self._refuse(job_id, why)
        form = _form(environ)
        action = (form.get("action") or [""])[0]
        if action not in ACTIONS:
            return self._refuse(job_id, f"unknown action; one of {', '.join(ACTIONS)}", "400 Bad Request")
        view, refused = self._actionable(job_id, browser)
        if refused is not None:
            return refused
        why = self.tokens.refusal((form.get("token") or [""])[0], browser.user, job_id)
        if why:
            return self._refuse(job_id, why)
        from ..alerting.train_asks import targets

        if not targets(view, None):
            return self._refuse(job_id, f"job {job_id} has no live process to ask", "409 Conflict")
        outcome = run_action(self.asks, self.loop, view, job_id, action,
                             (form.get("snapshot") or [""])[0] == "1", browser.asked_by())
        log.info("web: %s of job %s asked by %s", action, job_id, browser.asked_by())
        return "200 OK", outcome_page(job_id, outcome, time.time())

    @staticmethod
    def _send(start_response, status: str, body: str, extra=()):
        data = body.encode("utf-8")
        # same-origin, not no-referrer: under no-referrer a browser sends "Origin: null" with a form's POST,
        # and the POST's Origin is how an action is known to come from these pages
        start_response(status, [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(data))),
                                ("Content-Security-Policy", CSP), ("X-Content-Type-Options", "nosniff"),
                                ("Referrer-Policy", "same-origin"), ("Cache-Control", "no-store"), *extra])
        return [data]


def _form(environ) -> dict:
    """A POST's urlencoded form, at most MAX_FORM bytes read."""
    try:
        length = min(int(environ.get("CONTENT_LENGTH") or 0), MAX_FORM)
    except ValueError:
        length = 0
    body = environ["wsgi.input"].read(length) if length > 0 else b""
    return parse_qs(body.decode("utf-8", "replace"))


def _status_text(view) -> str:
    """`clusterwatch status`'s report of the view, unwrapped (the browser scrolls)."""
    from clusterwatch.report import render  # the report users know, word for word

    return render(view, width=None)
