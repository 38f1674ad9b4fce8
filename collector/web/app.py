"""The pages' WSGI app: routes, who may see which job (access.py), and the answer's headers.

Read-only: GET and HEAD only. There are no actions yet: the collector has no path to send a training
process a request (checkpoint, stop, diagnose), so the page shows no buttons for them.
"""
from __future__ import annotations

import logging
from urllib.parse import unquote

from ..query_auth import Caller
from .history import live_history, stored_history
from .pages import REFRESH_JS_HASH, index_page, job_page, message_page

log = logging.getLogger("clusterwatch.collector")

# Nothing from elsewhere, no inline script but the page's own (by hash), no framing, no form posts.
CSP = (f"default-src 'none'; script-src '{REFRESH_JS_HASH}'; style-src 'unsafe-inline'; connect-src 'self'; "
       "img-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'")
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
        caller: who a browser counts as (access.browser_caller).
        loopback: served on loopback only: a request must name a loopback host. A web site the user
            visits could otherwise read the pages through DNS rebinding (its own name resolving to
            127.0.0.1), the browser sending its name as Host.
    """

    def __init__(self, core, alerts, caller: Caller, loopback: bool = False) -> None:
        self.core = core
        self.alerts = alerts
        self.caller = caller
        self.loopback = loopback
        self.errors = 0

    def __call__(self, environ, start_response):
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            return self._send(start_response, "405 Method Not Allowed",
                              message_page("Not allowed", "These pages are read-only."), [("Allow", "GET, HEAD")])
        if self.loopback and not is_loopback(_host_name(environ.get("HTTP_HOST", ""))):
            return self._send(start_response, "421 Misdirected Request", message_page(
                "Not served", "These pages answer only to a loopback address (http://127.0.0.1:PORT/)."))
        path = environ.get("PATH_INFO", "/")
        if path == "/favicon.ico":  # browsers ask for it whatever the page says; there is none
            start_response("204 No Content", [("Cache-Control", "max-age=86400")])
            return [b""]
        try:
            status, body = self.route(path)
        except Exception:  # a page that cannot be built must not take the collector's thread with it
            self.errors += 1  # said once with its traceback, then counted: a refreshing page asks every 15 s
            if self.errors == 1:
                log.exception("web page %r failed (later failures are counted, not logged)", path[:200])
            status, body = "500 Internal Server Error", message_page("Error", "This page could not be built; "
                                                                     "the collector's log says why.")
        return self._send(start_response, status, body if method == "GET" else "")

    def route(self, path: str) -> tuple[str, str]:
        if path in ("/", "/jobs", "/jobs/"):
            return "200 OK", self.index()
        if path.startswith("/jobs/"):
            return self.job(unquote(path[len("/jobs/"):]))
        return "404 Not Found", message_page("Not found", "No such page: try / for the jobs.")

    def index(self) -> str:
        jobs = self.core.job_infos(True, self.caller.may_see)
        visible = {j.job_id for j in jobs}
        firing: dict[str, int] = {}
        if self.alerts is not None:
            for job_id, view in self.alerts.alert_list(None, False, 10_000):
                if view.state == "firing" and job_id in visible:
                    firing[job_id] = firing.get(job_id, 0) + 1
        note = "" if self.caller.admin else (
            "This collector identifies its users with munge, which a browser cannot present: no job is shown "
            "here. Use clusterwatch status JOBID, or ask the operator about --show-all-jobs.")
        return index_page(jobs, firing, note)

    def job(self, job_id: str) -> tuple[str, str]:
        view = self.core.live_job_view(job_id, TREND_POINTS)
        stored = view is None
        if stored:
            view = self.core.stored_job_view(job_id)
        if view is None:
            return "404 Not Found", message_page("Unknown job", f"Job {job_id} is unknown to this collector.")
        if not self.caller.may_see(view.job.user):
            # as the query service: whose it is is not named
            return "403 Forbidden", message_page(
                "Not shown", f"Job {job_id} is not shown here: this collector shows each user only their own "
                "jobs, and a browser cannot prove who it is. Use clusterwatch status " + job_id + ".")
        if not stored and self.alerts is not None:
            view.alerts.extend(self.alerts.alert_views(job_id))
            health = getattr(self.alerts, "health_views", None)  # the GPU health findings on the job's GPUs
            if health is not None:
                view.health.extend(health(job_id))
        history = None if stored else live_history(self.core, job_id)
        ranks, gpus = history if history is not None else stored_history(view)
        return "200 OK", job_page(view, _status_text(view), ranks, gpus, stored)

    @staticmethod
    def _send(start_response, status: str, body: str, extra=()):
        data = body.encode("utf-8")
        start_response(status, [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(data))),
                                ("Content-Security-Policy", CSP), ("X-Content-Type-Options", "nosniff"),
                                ("Referrer-Policy", "no-referrer"), ("Cache-Control", "no-store"), *extra])
        return [data]


def _status_text(view) -> str:
    """`clusterwatch status`'s report of the view, unwrapped (the browser scrolls)."""
    from clusterwatch.cli.render import render  # the report users know, word for word

    return render(view, width=None)
