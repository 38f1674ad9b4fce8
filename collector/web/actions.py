"""The job page's actions: Diagnose (dump_stacks, and memory_snapshot unless declined), Request checkpoint, Stop.

Each goes job page → confirmation page (GET, no effect) → POST, which is refused unless it names its own
site (Origin, Sec-Fetch-Site) and carries the token the confirmation page was built with: an HMAC of
the browser's user and the job under a secret of this collector's run, so that neither another site nor
another user's page can make one. The requests go through collector/train_asks.py on the collector's
event loop (its store connection lives there) and are recorded in its answers table with who asked.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..train_asks import targets

ACTIONS = {"diagnose": "Diagnose", "checkpoint": "Request checkpoint", "stop": "Stop"}
ANSWER_WAIT_S = 8.0  # as `clusterwatch diagnose`: the ranks' answers are waited for this long a request
MAX_FORM = 4096      # bytes of a POST body read


@dataclass
class Outcome:
    """What an action got: per request kind, its answers (TrainAnswerView), and the stacks' groups."""

    action: str
    answers: dict[str, list] = field(default_factory=dict)


class Tokens:
    """Per-page tokens bound to the browser's user and the job (HMAC under a secret of this run)."""

    def __init__(self, secret: bytes | None = None) -> None:
        self.secret = secret or secrets.token_bytes(32)

    def make(self, user: str, job_id: str) -> str:
        return hmac.new(self.secret, f"{user}\0{job_id}".encode(), hashlib.sha256).hexdigest()

    def check(self, token: str, user: str, job_id: str) -> bool:
        return hmac.compare_digest(token.encode(), self.make(user, job_id).encode())


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
