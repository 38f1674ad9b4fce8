"""Who a browser is: it cannot present a munge credential, so it is nobody in particular.

Without query authentication (--query-auth none, or auto where munge is not installed: a workstation,
`clusterwatch run`) everyone who reaches the page sees every job, as with `status`. Under munge the
browser is an unidentified caller: it sees every job only where every identified user would
(--show-all-jobs); otherwise each job page is refused, as `status` refuses a job not the caller's.
Pages then say to use `clusterwatch status`, which proves who is asking.
"""
from __future__ import annotations

from ..query_auth import Caller, NoAuth


def browser_caller(auth) -> Caller:
    """The caller a browser counts as under the query service's `auth` (query_auth's NoAuth, MungeAuth,
    AwaitingMunge)."""
    if auth is None or isinstance(auth, NoAuth):
        return Caller(None, "", admin=True)
    munge = getattr(auth, "munge", auth)  # AwaitingMunge wraps the MungeAuth it hands over to
    return Caller(None, "", admin=bool(getattr(munge, "show_all", False)))
