"""Serve the pages from a daemon thread, on the /metrics endpoint's bounded server (collector/serving/bounded_http.py),
over TCP or a Unix socket (for the site's proxy alone: serve_web_unix)."""
from __future__ import annotations

import os
import socket
import stat
import tempfile
import threading
from wsgiref.simple_server import make_server

from clusterwatch.errors import ConfigError

from ..serving.bounded_http import MAX_CONNECTIONS, REQUEST_TIMEOUT_S
from ..serving.bounded_http import BoundedServer as _Server
from ..serving.bounded_http import QuietHandler as _QuietHandler
from .access import UNIX_KEY
from .peer import PEER_KEY


def _no_underscored_headers(headers, env: dict) -> dict:
    """`env` with no header whose name has an underscore: wsgiref reads X_Remote_User as X-Remote-User (both
    HTTP_X_REMOTE_USER), and a proxy that strips or sets only the latter passes the former on from the
    browser. Dropped, as Apache does for CGI and nginx by default."""
    if not any("_" in name for name in headers.keys()):
        return env
    kept = {k: v for k, v in env.items() if not k.startswith("HTTP_")}
    for name, value in headers.items():
        key = name.replace("-", "_").upper()
        if "_" in name or key in kept:  # CONTENT_TYPE and CONTENT_LENGTH are kept without HTTP_
            continue
        key = "HTTP_" + key
        kept[key] = f"{kept[key]},{value.strip()}" if key in kept else value.strip()
    return kept


class _PeerHandler(_QuietHandler):
    """Says both ends of the connection (PEER_KEY: client, server address), for access.py to ask the kernel who
    the client is (peer.py); a key no header can write (headers come as HTTP_*)."""

    def get_environ(self):
        env = _no_underscored_headers(self.headers, super().get_environ())
        env[PEER_KEY] = (self.client_address[:2], self.connection.getsockname()[:2])
        return env


def serve_web(app, host: str, port: int):
    """Serve `app` on host:port (port 0: any free one; server_port says which); shutdown() and
    server_close() stop it."""
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

    class Server(_Server):
        address_family = family

    Server.max_connections, Server.request_timeout_s = MAX_CONNECTIONS, REQUEST_TIMEOUT_S
    httpd = make_server(sockaddr[0], port, app, Server, handler_class=_PeerHandler)
    threading.Thread(target=httpd.serve_forever, name="web-http", daemon=True).start()
    return httpd


class _UnixHandler(_QuietHandler):
    """A connection over the pages' socket: marked UNIX_KEY (a key no header can write), no client address."""

    def get_environ(self):
        env = _no_underscored_headers(self.headers, super().get_environ())
        env[UNIX_KEY] = True
        return env


class _UnixServer(_Server):
    """The bounded server on a Unix socket that appears at its path with its final owner group and mode only:
    bound in a private folder beside it, given to the group, then renamed into place, so that no one outside
    the group can connect in between (a umask is the whole process's, other threads' files included)."""

    address_family = socket.AF_UNIX
    group: int | None = None
    inode: int | None = None

    def server_bind(self) -> None:
        path = self.server_address
        private = tempfile.mkdtemp(prefix=".web-", dir=os.path.dirname(path))  # mode 0700
        staged = os.path.join(private, "s")
        try:
            self.socket.bind(staged)
            if self.group is not None:
                try:
                    os.chown(staged, -1, self.group)
                except PermissionError:
                    raise ConfigError(not_a_member(self.group)) from None
            os.chmod(staged, 0o660 if self.group is not None else 0o600)
            os.rename(staged, path)
        finally:
            if os.path.exists(staged):
                os.unlink(staged)
            os.rmdir(private)
        self.inode = os.stat(path).st_ino
        self.server_name, self.server_port = "localhost", 0
        self.setup_environ()

    def get_request(self):
        conn, _ = self.socket.accept()
        return conn, ("", 0)  # wsgiref reads client_address[0] as REMOTE_ADDR: none over a Unix socket

    def server_close(self) -> None:
        super().server_close()
        try:  # its own socket only: a path taken over since (another collector) is left alone
            if os.stat(self.server_address).st_ino == self.inode:
                os.unlink(self.server_address)
        except OSError:
            pass


def may_give_to_group(group: int) -> bool:
    """Whether this process may give a file it owns to `group`: a member of it, or holding CAP_CHOWN."""
    if group == os.getegid() or group in os.getgroups():
        return True
    try:
        with open("/proc/self/status") as f:
            caps = next((line.split()[1] for line in f if line.startswith("CapEff:")), "0")
    except OSError:
        return os.geteuid() == 0
    return bool(int(caps, 16) & 1)  # CAP_CHOWN is capability 0


def not_a_member(group: int) -> str:
    import grp

    try:
        name = grp.getgrgid(group).gr_name
    except KeyError:
        name = str(group)
    return (f"--web-socket-group {name}: the collector's user may not give its socket to {name}, not being a "
            f"member: add it to the group (systemd: SupplementaryGroups={name})")


def socket_folder_problem(path: str) -> str | None:
    """Why the pages' socket may not live in `path`'s folder: one others may write could swap the socket for
    theirs (the proxy would then send them its users); None when only the collector's user or root may."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        st = os.stat(folder)
    except OSError as exc:
        return f"--web-listen unix:{path}: the folder {folder}: {exc.strerror}"
    if st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o022:
        return (f"--web-listen unix:{path}: others may write in {folder} (mode {stat.S_IMODE(st.st_mode):04o}, "
                f"owner uid {st.st_uid}) and could put their own socket there for the proxy to reach: use a "
                "folder only the collector's user may write, e.g. /run/clusterwatch (systemd's RuntimeDirectory)")
    return None


def serve_web_unix(app, path: str, group: int | None = None):
    """Serve `app` on the Unix socket `path`, mode 0660 and group `group` (0600 without one), removed at
    server_close(); shutdown() stops it.

    Raises:
        ConfigError: the socket cannot be made there, or given to `group` (the collector's user is no member).
    """
    class Server(_UnixServer):
        pass

    Server.group = group
    Server.max_connections, Server.request_timeout_s = MAX_CONNECTIONS, REQUEST_TIMEOUT_S
    try:
        httpd = Server(path, _UnixHandler)
    except OSError as exc:
        raise ConfigError(f"cannot listen on unix:{path} (--web-listen): {exc.strerror or exc}") from None
    httpd.set_app(app)
    threading.Thread(target=httpd.serve_forever, name="web-http", daemon=True).start()
    return httpd

