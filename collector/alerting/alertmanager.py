"""Alerts to Alertmanager (--alertmanager URL), where the site's Prometheus alerts go: firing, re-sent, resolved.

Alertmanager expects its clients to send an alert again for as long as it fires (its docs: "on the order of 30
seconds to 3 minutes"); Prometheus does it every `--rules.alert.resend-delay` (1 minute) with endsAt 4 of those
ahead, so that the alerts of a Prometheus that died resolve by themselves a few minutes later, while a lost
send or two changes nothing. The same here: every firing alert goes at once, then again every RESEND_S with
endsAt ENDS_AFTER_RESENDS resends ahead; a resolved one goes once (endsAt its resolution), retried until an
Alertmanager takes it. Several URLs are several Alertmanagers of one HA cluster, as Prometheus lists them:
each gets every alert, from a thread of its own, so a down one delays nothing but itself, and the collector's
loop only hands alerts over (a dict and a lock), never waits on the network.

A send that fails (refused connection, timeout, a 5xx) is retried with backoff (clusterwatch/backoff.py) up to
RESEND_S apart; every failure is counted (clusterwatch_alertmanager_send_errors_total on /metrics) and said once
in the log until the Alertmanager takes alerts again. One it refuses as malformed (a 4xx) is counted, said and
not retried: sending it again would not change the answer. What waits for one Alertmanager is bounded
(MAX_WAITING alerts; past it the oldest are dropped and counted).
"""
from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.parse
from collections.abc import Callable, Iterable

from clusterwatch.background import BackgroundThread
from clusterwatch.backoff import Backoff
from clusterwatch.errors import ConfigError
from clusterwatch.log_once import SaidOnce

from .alertmanager_doc import document, labels
from .alerts import Alert
from .webhook import post_json

log = logging.getLogger("clusterwatch.alerts")

API_PATH = "/api/v2/alerts"
RESEND_S = 60.0  # Prometheus's --rules.alert.resend-delay default
ENDS_AFTER_RESENDS = 4  # a firing alert's endsAt, in resends ahead (Prometheus's 4 × resend delay)
TIMEOUT_S = 10.0  # one POST, answer included (Prometheus's default alertmanager timeout)
BATCH_MAX = 256  # alerts in one POST (Prometheus's maxBatchSize)
MAX_WAITING = 10_000  # alerts waiting for one Alertmanager

_SENT, _REFUSED, _FAILED = "sent", "refused", "failed"
# one alert to send: the alert, its labels, and when it resolved (None: firing)
_Entry = tuple[Alert, dict[str, str], "float | None"]


def alertmanager_urls(values: Iterable[str]) -> tuple[str, ...]:
    """The POST endpoints of --alertmanager values (each one URL, or several separated by commas or spaces).

    A URL is an Alertmanager's base (http://am:9093, or with the path prefix it is served under); one that
    already ends in /api/v2/alerts is taken as it is. Raises ConfigError (one line) for anything else.
    """
    out: list[str] = []
    for value in values:
        for url in value.replace(",", " ").split():
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
                raise ConfigError(f"--alertmanager {url!r} is not an Alertmanager's URL: give http://HOST:PORT "
                                  "(and its path prefix, if any), e.g. http://alertmanager:9093")
            base = url.rstrip("/")
            endpoint = base if base.endswith(API_PATH) else base + API_PATH
            if endpoint not in out:
                out.append(endpoint)
    return tuple(out)


def page_base_url(host: str, port: int) -> str:
    """The web pages' base URL as another host reaches it: a wildcard address is this host's name."""
    if host in ("", "0.0.0.0", "::"):
        host = socket.getfqdn()
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class AlertmanagerNotifier:
    """Sends the collector's firing and resolved alerts to one or more Alertmanagers.

    `fired`, `resolved` and `sync` are called on the collector's loop (the Dispatcher's process and tick) and
    return at once; a thread a URL sends.

    Args:
        urls: POST endpoints (`alertmanager_urls`).
        job_user: a job's user by its id ("" when unknown), read when an alert first fires; None: no user label.
        resend_s: a firing alert is sent again this often.
        timeout_s: the deadline of one POST.
        retry: the waits between failed sends (a fresh one for each URL); None: 1 s doubling up to resend_s.
        post: posts a JSON body (webhook.post_json; tests give another).
        wall: the time endsAt of a firing alert is counted from.
    """

    def __init__(self, urls: Iterable[str], job_user: Callable[[str], str] | None = None,
                 resend_s: float = RESEND_S, timeout_s: float = TIMEOUT_S,
                 retry: Callable[[], Backoff] | None = None, post: Callable[[str, bytes, float], int] = post_json,
                 wall: Callable[[], float] = time.time) -> None:
        self.page_base: str | None = None  # the web pages' base URL once they serve: generatorURL links a job page
        self.resend_s = resend_s
        self.timeout_s = timeout_s
        self._job_user = job_user
        self._post = post
        self._wall = wall
        self._lock = threading.Lock()
        self._firing: dict[int, tuple[Alert, dict[str, str]]] = {}  # alert id -> the alert and its labels as sent
        self.errors = 0  # failed sends (each try of each URL)
        self.dropped = 0  # alerts dropped, waiting for an Alertmanager past MAX_WAITING
        self._said = SaidOnce(log)
        retry = retry or (lambda: Backoff(initial_s=1.0, cap_s=resend_s, jitter=(0.5, 1.0)))
        self._targets = [_Target(self, url, retry()) for url in urls]
        for target in self._targets:
            target.thread.start()

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(t.url for t in self._targets)

    # -- on the collector's loop -------------------------------------------------------------------

    def fired(self, a: Alert) -> None:
        """An alert started firing: it goes now, then every resend."""
        with self._lock:
            alert_labels = self._labels(a, self._firing.get(a.id))
            self._firing[a.id] = (a, alert_labels)
        self._put(a, alert_labels, None)

    def resolved(self, a: Alert) -> None:
        """An alert resolved: it goes once, with the labels it fired with; one never sent firing goes nowhere."""
        with self._lock:
            held = self._firing.pop(a.id, None)
        if held is not None:
            self._put(a, held[1], a.resolved_at if a.resolved_at is not None else a.updated_at)

    def sync(self, firing: list[Alert], now: float) -> None:
        """The alerts firing now (every tick): their latest text is what the next resend carries; one whose
        labels changed (its severity) is resolved under the old ones and fires under the new; one that went
        without a resolution (the store resolved it after a restart) is resolved now."""
        changed: list[_Entry] = []
        with self._lock:
            held, self._firing = self._firing, {}
            for a in firing:
                old = held.pop(a.id, None)
                alert_labels = self._labels(a, old)
                self._firing[a.id] = (a, alert_labels)
                if old is None or old[1] != alert_labels:
                    if old is not None:
                        changed.append((old[0], old[1], now))
                    changed.append((a, alert_labels, None))
            changed.extend((a, alert_labels, now) for a, alert_labels in held.values())
        for entry in changed:
            self._put(*entry)

    def _labels(self, a: Alert, old: tuple[Alert, dict[str, str]] | None) -> dict[str, str]:
        # the user is read once: a job gone from the state by its alert's resolution must keep its label
        if old is not None:
            user = old[1].get("user", "")
        else:
            user = self._job_user(a.job_id) if self._job_user is not None and a.job_id else ""
        return labels(a, user)

    def _put(self, a: Alert, alert_labels: dict[str, str], resolved_at: float | None) -> None:
        for target in self._targets:
            target.put((a, alert_labels, resolved_at))

    # -- on the senders' threads -------------------------------------------------------------------

    def firing_entries(self) -> list[_Entry]:
        with self._lock:
            return [(a, alert_labels, None) for a, alert_labels in self._firing.values()]

    def body(self, entries: list[_Entry]) -> bytes:
        ends = self._wall() + ENDS_AFTER_RESENDS * self.resend_s
        return json.dumps([document(a, alert_labels, self.page_base, ends if resolved_at is None else resolved_at)
                           for a, alert_labels, resolved_at in entries]).encode()

    def send(self, url: str, entries: list[_Entry]) -> str:
        """POST the entries to one Alertmanager, BATCH_MAX at a time; _SENT, _REFUSED (a 4xx) or _FAILED."""
        for start in range(0, len(entries), BATCH_MAX):
            try:
                self._post(url, self.body(entries[start:start + BATCH_MAX]), self.timeout_s)
            except urllib.error.HTTPError as exc:
                answer = (exc.read(300).decode(errors="replace") if exc.fp is not None else "").strip()
                self._count_error()
                if 400 <= exc.code < 500 and exc.code != 429:  # malformed: the same alerts get the same answer
                    self._said.warning((url, exc.code), "Alertmanager %s refused %d alert(s), not sent again: "
                                       "HTTP %d %s", url, len(entries), exc.code, answer[:300])
                    return _REFUSED
                self._failed(url, f"HTTP {exc.code} {answer[:200]}")
                return _FAILED
            except OSError as exc:  # refused, unreachable, timed out (TimeoutError), a bad answer
                self._count_error()
                self._failed(url, str(exc))
                return _FAILED
        return _SENT

    def _failed(self, url: str, why: str) -> None:
        self._said.warning(url, "cannot send alerts to Alertmanager %s (%s); retrying with backoff, failures "
                                "counted in clusterwatch_alertmanager_send_errors_total", url, why)

    def back(self, url: str) -> None:
        """A send to `url` worked after failures: said once, and the next failure is said anew."""
        log.warning("Alertmanager %s takes alerts again", url)
        self._said.forget(url)

    def _count_error(self) -> None:
        with self._lock:  # each URL's thread counts
            self.errors += 1

    def flush(self, timeout: float) -> bool:
        """Wait until nothing waits to be sent (tests, shutdown); False if something still does."""
        deadline = time.monotonic() + timeout
        return all(t.idle(max(0.0, deadline - time.monotonic())) for t in self._targets)

    def close(self, timeout: float = TIMEOUT_S) -> None:
        """Try once more what waits (the resolutions of a collector stopping), then stop the threads."""
        for target in self._targets:
            target.close()
        deadline = time.monotonic() + timeout
        for target in self._targets:
            target.thread.stop(max(0.0, deadline - time.monotonic()))


class _Target:
    """One Alertmanager: what waits for it, when the next resend is due, its backoff, its thread."""

    def __init__(self, notifier: AlertmanagerNotifier, url: str, retry: Backoff) -> None:
        self.notifier = notifier
        self.url = url
        self.retry = retry
        # identity of an alert in Alertmanager (its labels) -> the latest entry for it: a resolution replaces
        # the firing it follows, if that has not gone yet
        self.waiting: dict[tuple, _Entry] = {}
        self.due = time.monotonic() + notifier.resend_s  # the next resend of every firing alert
        self.failing = False  # waits for the backoff, not for new alerts
        self.sending = False
        self.closing = False
        self.cond = threading.Condition()
        self.thread = BackgroundThread(self._run, name="clusterwatch-alertmanager", os_name="cw-alertmanager")

    def put(self, entry: _Entry) -> None:
        key = tuple(sorted(entry[1].items()))
        with self.cond:
            self.waiting.pop(key, None)
            if len(self.waiting) >= MAX_WAITING:
                del self.waiting[next(iter(self.waiting))]
                self.notifier.dropped += 1  # under this target's lock: only the loop's thread puts
            self.waiting[key] = entry
            self.cond.notify_all()

    def idle(self, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: not self.waiting and not self.sending, timeout)

    def close(self) -> None:
        with self.cond:
            self.closing = True
            self.cond.notify_all()

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.closing:
                    left = self.due - time.monotonic()
                    if left <= 0 or (self.waiting and not self.failing):
                        break
                    self.cond.wait(left)
                if self.closing and not self.waiting:
                    return
                full = time.monotonic() >= self.due
                taken = dict(self.waiting)
                self.sending = True
            entries = list(taken.values())
            if full:  # a resend: every firing alert, besides what waits
                keys = set(taken)
                entries += [e for e in self.notifier.firing_entries() if tuple(sorted(e[1].items())) not in keys]
            outcome = self.notifier.send(self.url, entries) if entries else _SENT
            with self.cond:
                self.sending = False
                if outcome == _FAILED:
                    self.failing = True
                    self.due = time.monotonic() + self.retry.next_wait()
                else:
                    if self.failing and outcome == _SENT:
                        self.notifier.back(self.url)
                    for key, entry in taken.items():
                        if self.waiting.get(key) is entry:  # not replaced while it was sent
                            del self.waiting[key]
                    if full or self.failing:
                        self.due = time.monotonic() + self.notifier.resend_s
                    self.failing = False
                    self.retry.reset()
                self.cond.notify_all()
                if self.closing and outcome == _FAILED:
                    return
