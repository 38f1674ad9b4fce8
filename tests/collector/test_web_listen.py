"""--web-listen: where the pages are served, and what a taken or wrong address does."""
from __future__ import annotations

import json
import socket

import pytest

from tests.support.helpers import CLI, Collector, Proc, cli, wait_for

pytestmark = pytest.mark.e2e


def _held_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_a_unix_socket_without_a_group_is_the_collectors_users_alone(tmp_path):
    """unix:PATH serves the pages to the site's proxy (test_web_proxy_trust.py); without --web-socket-group the
    socket is mode 0600, and no Host check applies (no browser reaches it to be rebound)."""
    import http.client
    import os
    import stat

    sock = tmp_path / "web.sock"
    c = Collector(tmp_path, "--web-listen", f"unix:{sock}")
    try:
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".web-")]  # its staging folder is gone

        class Unix(http.client.HTTPConnection):
            def connect(self):
                self.sock = socket.socket(socket.AF_UNIX)
                self.sock.connect(str(sock))

        conn = Unix("localhost", timeout=10)
        conn.request("GET", "/", headers={"Host": "clusterwatch.example.org"})
        assert conn.getresponse().status == 200
    finally:
        c.stop()
    assert not sock.exists()


def test_a_taken_address_given_stops_the_start_in_one_line(tmp_path):
    with _held_port() as held:
        port = held.getsockname()[1]
        r = cli("collector", "--listen", "127.0.0.1:0", "--metrics-listen", "none", "--query-auth", "none",
                "--web-listen", f"127.0.0.1:{port}", "--db", str(tmp_path / "db"), timeout=30)
    assert r.returncode != 0 and "--web-listen" in r.stderr and str(port) in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_none_serves_no_pages(tmp_path):
    c = Collector(tmp_path, "--web-listen", "none")
    try:
        assert json.loads(c.ports_file.read_text())["web"] == 0
        assert "web pages on port -" in c.text()
    finally:
        c.stop()


def test_the_default_address_taken_only_warns(tmp_path):
    # whoever holds 127.0.0.1:9752 now (a collector of this host, or this test), it is taken
    held = None
    try:
        held = socket.create_server(("127.0.0.1", 9752))
    except OSError:
        pass
    ports = tmp_path / "ports.json"
    c = Proc([*CLI, "collector", "--listen", "127.0.0.1:0", "--metrics-listen", "none", "--query-auth", "none",
              "--db", str(tmp_path / "db"), "--ports-file", str(ports)], tmp_path / "collector.log")
    try:
        wait_for(lambda: ports.exists() or c.popen.poll() is not None, what="collector ports")
        assert json.loads(ports.read_text())["web"] == 0, c.text()
        assert "127.0.0.1:9752" in c.text() and "serving no web pages" in c.text()
    finally:
        c.stop()
        if held is not None:
            held.close()
