"""The job page's actions: Diagnose (dump_stacks, and memory_snapshot unless declined), Request checkpoint, Stop.

Each goes job page → confirmation page (GET, no effect) → POST, which is refused unless it names its own
site (Origin, Sec-Fetch-Site) and carries the token the confirmation page was built with: an HMAC of the
browser's user, the job and the page's time under the collector's key (kept beside its store across
restarts), so that neither another site nor another user's page can make one, and an old page expires. The
requests go through collector/alerting/train_asks.py on the collector's event loop (its store connection lives there)
and are recorded in its answers table with who asked.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..alerting.train_asks import targets

ACTIONS = {"diagnose": "Diagnose", "checkpoint": "Request checkpoint", "stop": "Stop"}
ANSWER_WAIT_S = 8.0  # as `clusterwatch diagnose`: the ranks' answers are waited for this long a request
MAX_FORM = 4096      # bytes of a POST body read
TOKEN_TTL_S = 12 * 3600  # a confirmation page is answered in minutes; a day's work at most
CLOCK_SLACK_S = 60       # a clock stepped back a little must not refuse the page just made


@dataclass
class Outcome:
    """What an action got: per request kind, its answers (TrainAnswerView), and the stacks' groups."""

    action: str
    answers: dict[str, list] = field(default_factory=dict)


class Tokens:
    """Per-page tokens bound to the browser's user and the job, and to when the page was made: the hex of
    that time then of an HMAC of the three under the collector's key (store.web_token_secret: kept across
    restarts, so a page opened before one still works after), good for TOKEN_TTL_S (the key no longer
    changes at a restart, so the time bounds a token's life)."""

    def __init__(self, secret: bytes | None = None, clock=time.time) -> None:
        self.secret = secret or secrets.token_bytes(32)
        self.clock = clock

    def _mac(self, user: str, job_id: str, made: int) -> str:
        return hmac.new(self.secret, f"{user}\0{job_id}\0{made}".encode(), hashlib.sha256).hexdigest()

    def make(self, user: str, job_id: str) -> str:
        made = int(self.clock())
        return f"{made:08x}{self._mac(user, job_id, made)}"

    def refusal(self, token: str, user: str, job_id: str) -> str:
        """Why `token` does not do for this user and job; "" when it does."""
        made_hex, mac = token[:8], token[8:]
        try:
            made = int(made_hex, 16)
        except ValueError:
            made = -1
        if made < 0 or not hmac.compare_digest(mac.encode(), self._mac(user, job_id, made).encode()):
            return "the form's token is missing or is not this page's: open the job's page and ask again from it"
        age = self.clock() - made
        if not -CLOCK_SLACK_S <= age <= TOKEN_TTL_S:
            return (f"this confirmation page is more than {TOKEN_TTL_S // 3600} hours old: open the job's page "
                    "and ask again from it")
        return ""


def _netloc(value: str, scheme: str) -> str:
    """host[:port] lowercased, without the scheme's default port."""
    value = value.strip().lower()
    default = {"http": ":80", "https": ":443"}.get(scheme, "")
    return value[: -len(default)] if default and value.endswith(default) else value


def why_not_same_site(environ, proxied: bool) -> str:
    """Why a POST does not come from these pages themselves; "" when it does.

    The Origin must be sent and name the Host asked (or, through a trusted proxy, the host it forwarded
    for); Sec-Fetch-Site, where the browser sends it, must say same-origin.
    """
    fetch_site = environ.get("HTTP_SEC_FETCH_SITE", "")
    if fetch_site and fetch_site not in ("same-origin", "none"):
        return f"the request came from another site (Sec-Fetch-Site: {fetch_site[:40]})"
    origin = environ.get("HTTP_ORIGIN", "")
    if not origin or origin == "null":
        return "the request did not say which page sent it (no Origin): send it from the job's page"
    parts = urlsplit(origin)
    got = _netloc(parts.netloc, parts.scheme)
    hosts = {_netloc(environ.get("HTTP_HOST", ""), parts.scheme)}
    if proxied:
        hosts |= {_netloc(h, parts.scheme) for h in environ.get("HTTP_X_FORWARDED_HOST", "").split(",") if h}
    if got not in hosts:
        return f"the request came from another site ({origin[:80]})"
    return ""


def run_action(asks, loop, view, job_id: str, action: str, snapshot: bool, asked_by: str) -> Outcome:
    """Ask the job's live ranks (from the web server's thread; the asking runs on the collector's loop)."""
    chosen = targets(view, None)
    kinds = {"diagnose": ["dump_stacks"] + (["memory_snapshot"] if snapshot else []),
             "checkpoint": ["checkpoint"], "stop": ["stop"]}[action]
    outcome = Outcome(action)
    for kind in kinds:
        future = asyncio.run_coroutine_threadsafe(asks.ask(job_id, chosen, kind, asked_by, ANSWER_WAIT_S), loop)
        outcome.answers[kind] = list(future.result(timeout=ANSWER_WAIT_S + 20))
    return outcome
