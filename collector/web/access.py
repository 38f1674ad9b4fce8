"""Who a browser is, and what it may do: see a job's page, act on the job (diagnose, checkpoint, stop).

A browser cannot present a munge credential, so by itself it is nobody in particular. Without query
authentication (--query-auth none, or auto where munge is not installed: a workstation, `clusterwatch
run`) everyone who reaches the page sees every job, as with `status`. Under munge the browser sees every
job only where every identified user would (--show-all-jobs); otherwise each job page is refused.

Behind the site's authenticating reverse proxy (--web-user-header NAME), the header names the user, but
only on a request that proves it comes from the proxy, by something a user of the collector's host or
the proxy's cannot forge: the proxy's secret (--web-proxy-secret-file; the proxy sends it in
X-Clusterwatch-Proxy-Secret, compared in constant time), or the connection itself, over the Unix socket
only the proxy's group may open (--web-listen unix:PATH). An address (--web-trusted-proxy) narrows where
the secret is taken from, but is no proof alone: every user of the proxy's host sends from it (loopback:
every user of this one). A request that carries the header (or a secret) without that proof is refused.
The user then sees their own jobs (and every job as an admin, --query-admins, or with --show-all-jobs),
as the query service shows them.

With an owner uid (--web-owner-uid, what `clusterwatch run` gives its collector), the pages answer only that
local user's connections (and root's), as the kernel's socket table names their other end (peer.py): on a
shared host every user reaches loopback, and the run's job is its user's alone.

Actions (--web-actions, off by default) need the job's owner or an admin as the header names them; with
no proxy configured, only where queries are unauthenticated and the collector opts in to that
(--allow-unauthenticated-actions, collector/queries/action_rights.py: the page is then one user's own, as
`clusterwatch run` and `demo` give it): a browser that is nobody in particular acts on nothing.
"""
from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass

from clusterwatch.errors import ConfigError

from ..queries import action_rights
from ..queries.auth import Caller, NoAuth
from . import peer

NOT_THE_OWNERS = ("these pages answer only their user's own browser (the collector's --web-owner-uid, as "
                  "clusterwatch run starts it), and this connection comes from another user of this host")
HEADER_FROM_ELSEWHERE = ("this request names its user in the proxy header but does not come from the proxy (its "
                         "secret, from its address): it is refused; reach the pages through the proxy")
SECRET_HEADER = "X-Clusterwatch-Proxy-Secret"
SECRET_KEY = "HTTP_X_CLUSTERWATCH_PROXY_SECRET"
UNIX_KEY = "clusterwatch.unix"  # the WSGI environ's mark of a connection over the pages' Unix socket (server.py)
MIN_SECRET = 32  # characters: `openssl rand -hex 16` gives 32
NO_CREDENTIAL = ("--web-user-header needs a credential only the proxy has: --web-proxy-secret-file FILE (the proxy "
                 f"sends it in {SECRET_HEADER}) or --web-listen unix:PATH (a socket only the proxy's group may "
                 "open); an address (--web-trusted-proxy) alone is none, every user of the proxy's host sends "
                 "from it")


@dataclass(frozen=True, slots=True)
class Browser:
    """One request's browser: whom it counts as (`caller`, for seeing) and whether it may act on all jobs.

    Attributes:
        caller: the query service's Caller it counts as (may_see).
        acts_on_all: may act on every job (no authentication at all, or an admin behind the proxy).
        refused: why the request is refused whole (a forged proxy header), else "".
        via_proxy: the request came from a trusted proxy (its X-Forwarded-Host counts as the page's host).
        not_acting: why this unidentified browser acts on nothing, where that is not for want of a proxy.
    """

    caller: Caller
    acts_on_all: bool = False
    refused: str = ""
    via_proxy: bool = False
    not_acting: str = ""

    @property
    def user(self) -> str:
        return self.caller.user

    def may_see(self, owner: str) -> bool:
        return not self.refused and self.caller.may_see(owner)

    def why_not_act(self, owner: str, actions_on: bool) -> str:
        """Why this browser may not act on a job of `owner`; "" when it may."""
        if not actions_on:
            return ("this page is read-only: the collector was started without --web-actions; use clusterwatch "
                    "diagnose on a login node")
        if self.refused:
            return self.refused
        if self.acts_on_all or (self.caller.user and self.caller.user == owner):
            return ""
        if not self.caller.user:
            return self.not_acting or ("this browser is not identified (no authenticating proxy in front of these "
                                       "pages, and queries need munge): only the job's owner or an admin may act "
                                       "on a job")
        return f"you are {self.caller.user}: only the job's owner or an admin may act on it"

    def asked_by(self) -> str:
        """How the answers table records who asked."""
        return f"web user {self.caller.user}" if self.caller.user else "web (no authentication)"


def browser_caller(auth) -> Caller:
    """The caller a browser with no proxy header counts as under the query service's `auth` (query_auth's
    NoAuth, MungeAuth, AwaitingMunge)."""
    if auth is None or isinstance(auth, NoAuth):
        return Caller(None, "", admin=True)
    munge = getattr(auth, "munge", auth)  # AwaitingMunge wraps the MungeAuth it hands over to
    return Caller(None, "", admin=bool(getattr(munge, "show_all", False)))


def parse_proxies(values) -> tuple:
    """--web-trusted-proxy values (addresses or networks, comma separated too) as ip networks.

    Raises:
        ConfigError: one is not an address or network; the message names it and the option.
    """
    nets = []
    for value in values:
        for part in str(value).split(","):
            part = part.strip()
            if not part:
                continue
            try:
                nets.append(ipaddress.ip_network(part, strict=False))
            except ValueError:
                raise ConfigError(f"--web-trusted-proxy: {part!r} is not an IP address or network "
                                  "(e.g. 10.1.2.3 or 10.1.0.0/16)") from None
    return tuple(nets)


def read_proxy_secret(path: str) -> bytes:
    """The proxy's secret in `path`: a file only the collector's user may read or change (owned by it or root,
    no access for group or others), its first line, at least MIN_SECRET visible ASCII characters.

    Raises:
        ConfigError: the file is missing, open to others, or its secret too short; the message says what to do.
    """
    from clusterwatch.secret_file import read_secret_file

    return read_secret_file(path, f"--web-proxy-secret-file {path}", "the proxy's secret", MIN_SECRET)


class BrowserAccess:
    """Who each request's browser is.

    Args:
        auth: the query service's authenticator (who an unproxied browser counts as).
        user_header: the proxy's header naming the authenticated user (e.g. X-Remote-User); None: no proxy.
        trusted_proxies: addresses/networks (ipaddress) the proxy's secret is taken from; (): any.
        proxy_secret: what the proxy sends in SECRET_HEADER (read_proxy_secret); None: only a connection over
            the pages' Unix socket comes from the proxy.
        admins: users (names) who see and act on every job behind the proxy (--query-admins; root too).
        show_all: every identified user sees every job (--show-all-jobs); acting still needs owner or admin.
        owner_uid: only this local user's connections (and root's) are answered; None: anyone's.
        peer_uid: who opened a connection (peer.peer_uid), for tests to stand in.
        unauthenticated_actions: without query authentication an unproxied browser acts on every job
            (--allow-unauthenticated-actions); False: on none.
    """

    def __init__(self, auth, user_header: str | None = None, trusted_proxies: tuple = (),
                 admins: frozenset[str] = frozenset(), show_all: bool = False, owner_uid: int | None = None,
                 peer_uid=peer.peer_uid, unauthenticated_actions: bool = False,
                 proxy_secret: bytes | None = None) -> None:
        self.base = browser_caller(auth)
        self.unauthenticated = action_rights.unauthenticated(auth)
        # what an unproxied browser may do: the query service's decision for an unauthenticated caller
        self.unproxied = dict(acts_on_all=self.unauthenticated and unauthenticated_actions,
                              not_acting=action_rights.NOT_OPTED_IN if self.unauthenticated else "")
        self.environ_key = "HTTP_" + user_header.upper().replace("-", "_") if user_header else None
        self.trusted_proxies = trusted_proxies
        self.proxy_secret = proxy_secret
        self.admins = frozenset(admins) | {"root"}
        self.show_all = show_all or self.base.admin and not self.unauthenticated
        self.forged = 0  # requests with the header (or a secret) not from the proxy: counted, not logged
        self.owner_uid = owner_uid
        self.peer_uid = peer_uid
        self.other_users = 0  # connections from another local user than owner_uid: counted, not logged

    def _from_proxy(self, environ) -> bool:
        """The request proves it comes from the proxy: its secret where one is set (from a trusted address where
        some are given), else the pages' Unix socket, which only the proxy may open."""
        unix = environ.get(UNIX_KEY) is True
        if self.proxy_secret is None:
            return unix
        given = environ.get(SECRET_KEY, "").strip().encode("latin-1", "replace")
        if not hmac.compare_digest(given, self.proxy_secret):
            return False
        return unix or not self.trusted_proxies or self._trusted(environ.get("REMOTE_ADDR", ""))

    def _trusted(self, addr: str) -> bool:
        try:
            ip = ipaddress.ip_address(addr.split("%")[0])
        except ValueError:
            return False
        if getattr(ip, "ipv4_mapped", None) is not None:
            ip = ip.ipv4_mapped
        return any(ip in net for net in self.trusted_proxies)

    def _owners(self, environ) -> bool:
        """The connection comes from owner_uid or root (unknown: not theirs)."""
        ends = environ.get(peer.PEER_KEY)
        uid = self.peer_uid(*ends) if ends else None
        return uid is not None and uid in (self.owner_uid, 0)

    def browser(self, environ) -> Browser:
        """The browser of one WSGI request."""
        if self.owner_uid is not None and not self._owners(environ):
            self.other_users += 1
            return Browser(Caller(None, "", admin=False), refused=NOT_THE_OWNERS)
        if self.environ_key is None:
            return Browser(self.base, **self.unproxied)
        named = environ.get(self.environ_key, "").strip()
        if not self._from_proxy(environ):
            if named or environ.get(SECRET_KEY):
                self.forged += 1
                return Browser(Caller(None, "", admin=False), refused=HEADER_FROM_ELSEWHERE)
            return Browser(self.base, **self.unproxied)
        if not named:  # the proxy let it through unauthenticated: nobody in particular
            return Browser(Caller(None, "", admin=self.show_all), via_proxy=True)
        admin = named in self.admins
        return Browser(Caller(None, named, admin=admin or self.show_all), acts_on_all=admin, via_proxy=True)


class FixedAccess:
    """Every request's browser is the same caller (tests, and a WebApp built without BrowserAccess)."""

    def __init__(self, caller: Caller, acts_on_all: bool = False) -> None:
        self.fixed = Browser(caller, acts_on_all=acts_on_all)

    def browser(self, environ) -> Browser:
        return self.fixed
