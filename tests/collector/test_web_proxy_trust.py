"""The pages trust their authenticating proxy by a credential a local user cannot forge (issue 24).

Behind the proxy the user header makes a browser whoever it names (root included): a header anyone on the
collector host can write, so its sender must prove it is the proxy. Either the proxy sends a secret read
from a file only the collector's user may read (--web-proxy-secret-file), or the pages are served on a
Unix socket only the proxy's group may open (--web-listen unix:PATH --web-socket-group GROUP). An address
(--web-trusted-proxy) alone is no credential: every user of the proxy's host sends from it.

A real collector under munge (where an unproxied browser sees no job) with a real agent and rank whose job
is root's (tests/web_stack.py); requests from real other Unix users (useradd) where who sends is the point.
"""
from __future__ import annotations

import grp
import http.client
import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.cli.test_cli_mistakes import one_line
from tests.support.helpers import CLI, clean_environ, cli, metric_value
from tests.support.local_users import group_and_two_users, run_as
from tests.web_stack import JOB_ID, PROXY_SECRET, PROXY_SECRET_HEADER, start_web_stack

pytestmark = pytest.mark.e2e

SECRET, SECRET_HEADER = PROXY_SECRET, PROXY_SECRET_HEADER

# a request as a shell user would send it (curl -H ...), over TCP or the Unix socket: "STATUS BODY", or
# "REFUSED errno" when the connection itself is refused
FETCH = r"""
import http.client, json, socket, sys
where, path, headers = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
class Unix(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(20)
        self.sock.connect(where)
try:
    conn = Unix("localhost", timeout=20) if where.startswith("/") else http.client.HTTPConnection(where, timeout=20)
    conn.request("GET", path, headers=headers)
    r = conn.getresponse()
    print(r.status, r.read().decode())
except OSError as exc:
    print("REFUSED", exc.errno)
"""


def _fetch_as(user: str, where: str, path: str, headers: dict) -> tuple[str, str]:
    r = run_as(user, FETCH, where, path, json.dumps(headers))
    assert r.returncode == 0, r.stderr
    code, _, body = r.stdout.partition(" ")
    return code, body


def _get(port: int, path: str, headers: dict, source: str | None = None) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20,
                                      source_address=(source, 0) if source else None)
    conn.request("GET", path, headers=headers)
    r = conn.getresponse()
    return r.status, r.read().decode()


def _secret_file(folder: Path, text: str = SECRET + "\n", mode: int = 0o600) -> Path:
    path = folder / "web-proxy-secret"
    path.write_text(text)
    path.chmod(mode)
    return path


def _munge(munged) -> tuple[tuple[str, ...], dict]:
    return ("--query-auth", "munge", "--munge-socket", str(munged)), {"CLUSTERWATCH_MUNGE_SOCKET": str(munged)}


def test_a_header_from_the_proxy_address_alone_is_refused_at_start(tmp_path):
    """What docs/operators.md set up until now: `curl -H 'X-Remote-User: root' 127.0.0.1:9752` from any shell
    user was root on the pages. Refused at start in one line saying what to use instead."""
    r = cli("collector", "--listen", "127.0.0.1:0", "--metrics-listen", "none", "--query-auth", "none",
            "--db", str(tmp_path / "db"), "--web-listen", "127.0.0.1:0", "--web-user-header", "X-Remote-User",
            "--web-trusted-proxy", "127.0.0.1", timeout=30)
    one_line(r, 2, "--web-proxy-secret-file", "unix:", "every user")


def test_with_the_secret_only_the_proxy_names_the_user(tmp_path, munged):
    args, env = _munge(munged)
    secret = _secret_file(tmp_path)
    s = start_web_stack(tmp_path, *args, "--web-user-header", "X-Remote-User", "--web-trusted-proxy", "127.0.0.1",
                        "--web-proxy-secret-file", str(secret), cli_env=env)
    page = f"/jobs/{JOB_ID}"
    try:
        with group_and_two_users() as users:
            # a shell user forging the header: from the proxy's address, with no secret or a wrong one
            for headers in ({"X-Remote-User": "root"}, {"X-Remote-User": "root", SECRET_HEADER: "guess"}):
                code, body = _fetch_as(users.outsider, f"127.0.0.1:{s.web_port}", page, headers)
                assert code == "403" and "proxy" in body and "not shown" not in body, (code, body)
        # ... from another address than the proxy's, even with the secret
        code, body = _get(s.web_port, page, {"X-Remote-User": "root", SECRET_HEADER: SECRET}, source="127.0.0.2")
        assert code == 403 and "proxy" in body, body
        # the proxy: its secret, from its address; the user it names is the one served
        assert _get(s.web_port, page, {"X-Remote-User": "root", SECRET_HEADER: SECRET})[0] == 200
        code, body = _get(s.web_port, page, {"X-Remote-User": "alice", SECRET_HEADER: SECRET})
        assert code == 403 and "not shown here" in body  # alice's own jobs only: not root's
        # the browser's X_Remote_User passed on by the proxy, which names no one: nobody in particular
        code, body = _get(s.web_port, page, {"X_Remote_User": "root", SECRET_HEADER: SECRET})
        assert code == 403 and "not shown here" in body
        # no header at all: a browser under munge, nobody in particular
        code, body = _get(s.web_port, page, {})
        assert code == 403 and "not shown here" in body
        assert SECRET not in s.collector.text()
        # the three forged requests above (two of the outsider's, one from another address) are counted
        assert metric_value(s.collector.metrics(), "clusterwatch_web_requests_forged_total") == 3
    finally:
        s.stop()


def test_on_the_unix_socket_only_the_proxys_group_may_connect(tmp_path, munged):
    args, env = _munge(munged)
    # a folder any user may enter, as /run/clusterwatch is: the socket's own mode keeps others out
    folder = Path(tempfile.mkdtemp(prefix="cw-web-", dir="/tmp"))
    folder.chmod(0o755)
    sock = folder / "web.sock"
    try:
        with group_and_two_users() as users:
            s = start_web_stack(tmp_path, *args, "--web-listen", f"unix:{sock}", "--web-socket-group", users.group,
                                "--web-user-header", "X-Remote-User", cli_env=env)
            try:
                st = os.stat(sock)
                assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660
                assert st.st_gid == grp.getgrnam(users.group).gr_gid
                assert s.web_port == 0  # no TCP port to forge the header on
                page = f"/jobs/{JOB_ID}"
                code, errno_text = _fetch_as(users.outsider, str(sock), page, {"X-Remote-User": "root"})
                assert code == "REFUSED" and errno_text.strip() == "13", (code, errno_text)  # EACCES
                code, body = _fetch_as(users.member, str(sock), page, {"X-Remote-User": "root"})
                assert code == "200" and JOB_ID in body, (code, body[:300])
                code, body = _fetch_as(users.member, str(sock), page, {"X-Remote-User": "alice"})
                assert code == "403" and "not shown here" in body
                # a browser's X_Remote_User, which a proxy that strips X-Remote-User passes on: not a user header
                # (wsgiref would read it as one), where the proxy names no one or someone
                for headers in ({"X_Remote_User": "root"}, {"X-Remote-User": "alice", "X_Remote_User": "root"}):
                    code, body = _fetch_as(users.member, str(sock), page, headers)
                    assert code == "403" and "not shown here" in body, (headers, code, body[:300])
            finally:
                s.stop()
            assert not sock.exists()  # removed at the collector's stop
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("mode,owner,words", [
    (0o640, None, ("readable by others", "chmod 600")),
    (0o604, None, ("readable by others", "chmod 600")),
    (0o600, "other", ("owned by",)),
    (0o600, None, ("at least 32",)),  # a short secret
])
def test_a_secret_file_others_may_read_or_change_is_refused_in_one_line(tmp_path, mode, owner, words):
    secret = _secret_file(tmp_path, "short\n" if "at least 32" in words else SECRET, mode)
    with group_and_two_users() as users:
        if owner:
            os.chown(secret, pwd.getpwnam(users.outsider).pw_uid, -1)
        r = cli("collector", "--listen", "127.0.0.1:0", "--metrics-listen", "none", "--query-auth", "none",
                "--db", str(tmp_path / "db"), "--web-listen", "127.0.0.1:0", "--web-user-header", "X-Remote-User",
                "--web-proxy-secret-file", str(secret), timeout=30)
    one_line(r, 2, "--web-proxy-secret-file", *words)


@pytest.mark.parametrize("args,words", [
    (["--web-proxy-secret-file", "/no/such/file"], ("--web-proxy-secret-file", "/no/such/file")),
    (["--web-listen", "127.0.0.1:0", "--web-socket-group", "root"], ("--web-socket-group", "unix:")),
    (["--web-listen", "unix:{tmp}/w.sock", "--web-socket-group", "no-such-group-cw"], ("no-such-group-cw",)),
    (["--web-listen", "unix:{tmp}/w.sock", "--web-user-header", "X-Remote-User", "--web-trusted-proxy",
      "127.0.0.1"], ("--web-trusted-proxy", "socket")),
    (["--web-listen", "unix:{open}/w.sock"], ("others may write",)),
])
def test_the_proxy_options_say_what_is_wrong_in_one_line(tmp_path, args, words):
    open_folder = tmp_path / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    args = [a.format(tmp=tmp_path, open=open_folder) for a in args]
    if args[0] == "--web-proxy-secret-file":
        args = ["--web-listen", "127.0.0.1:0", "--web-user-header", "X-Remote-User", *args]
    r = cli("collector", "--listen", "127.0.0.1:0", "--metrics-listen", "none", "--query-auth", "none",
            "--db", str(tmp_path / "db"), *args, timeout=30)
    one_line(r, 2, *words)


def test_the_secret_file_alone_says_it_needs_the_header(tmp_path):
    r = cli("collector", "--listen", "127.0.0.1:0", "--metrics-listen", "none", "--query-auth", "none",
            "--db", str(tmp_path / "db"), "--web-proxy-secret-file", str(_secret_file(tmp_path)), timeout=30)
    one_line(r, 2, "--web-user-header")


def test_a_collector_that_may_not_give_the_socket_to_the_group_says_so_in_one_line(tmp_path):
    """The collector gives its socket to --web-socket-group without privilege: its user must be a member. Here
    a root without CAP_CHOWN (setpriv), in no such group, stands for the unprivileged service user."""
    with group_and_two_users() as users:
        r = subprocess.run(["setpriv", "--bounding-set=-chown", "--inh-caps=-chown", "--", *CLI, "collector",
                            "--listen", "127.0.0.1:0", "--metrics-listen", "none", "--query-auth", "none",
                            "--db", str(tmp_path / "db"), "--web-listen", f"unix:{tmp_path}/w.sock",
                            "--web-socket-group", users.group],
                           capture_output=True, text=True, timeout=60, env=clean_environ())
    one_line(r, 2, users.group, "member")
    assert not (tmp_path / "w.sock").exists()
