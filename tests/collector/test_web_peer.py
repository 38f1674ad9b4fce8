"""Who opened a loopback connection, from the kernel's socket table (collector/web/peer.py), and the pages
that answer only their owner's connections (--web-owner-uid, access.py). Another user's real connection to
a real `run`'s page: tests/cli/test_run_web.py."""
from __future__ import annotations

import os
import socket

import pytest
from clusterwatch.collector.queries.auth import NoAuth
from clusterwatch.collector.web.access import NOT_THE_OWNERS, BrowserAccess
from clusterwatch.collector.web.peer import PEER_KEY, find_uid, peer_uid

# /proc/net/tcp and tcp6 rows as the kernel wrote them for a loopback connection 127.0.0.1:38802 →
# 127.0.0.1:35185 (and [::1]:44313 → [::1]:34146), the uids edited: the client's 1001, the server's 0; a
# listening socket's row (state 0A) among them
TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   2: 0100007F:8971 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1002        0 3612013 1 0 100 0 0 10 0
  13: 0100007F:9792 0100007F:8971 01 00000000:00000000 00:00000000 00000000  1001        0 3612014 2 0 20 0 0 10 -1
  21: 0100007F:8971 0100007F:9792 01 00000000:00000000 00:00000000 00000000     0        0 3612015 1 0 20 0 0 10 -1
  garbage
"""
LOOP6 = "00000000000000000000000001000000"  # ::1
TCP6 = (
    "  sl  local_address                         remote_address                        st tx_queue rx_queue tr "
    "tm->when retrnsmt   uid  timeout inode\n"
    f"   5: {LOOP6}:AD19 {LOOP6}:8562 01 00000000:00000000 00:00000000 00000000  1001        0 3612020 1 0 20 "
    "0 0 10 -1\n"
    f"  78: {LOOP6}:8562 {LOOP6}:AD19 01 00000000:00000000 00:00000000 00000000     0        0 3612019 2 0 20 "
    "0 0 10 -1\n")


@pytest.mark.parametrize("table, client, server, uid", [
    (TCP, ("127.0.0.1", 38802), ("127.0.0.1", 35185), 1001),
    (TCP, ("127.0.0.1", 35185), ("127.0.0.1", 38802), 0),        # the server's own end is the server's
    (TCP, ("::ffff:127.0.0.1", 38802), ("127.0.0.1", 35185), 1001),  # as a dual-stack socket names it
    (TCP, ("127.0.0.1", 38803), ("127.0.0.1", 35185), None),     # no such connection
    (TCP, ("0.0.0.0", 0), ("127.0.0.1", 35185), None),           # the listening row is no connection
    (TCP6, ("::1", 44313), ("::1", 34146), 1001),
    (TCP6, ("127.0.0.1", 44313), ("127.0.0.1", 34146), None),
])
def test_the_uid_of_a_connections_client_end(table, client, server, uid):
    assert find_uid(table, client, server) == uid


@pytest.mark.parametrize("family, host", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_a_real_loopback_connection_is_ours(family, host):
    with socket.socket(family) as server:
        server.bind((host, 0))
        server.listen()
        with socket.socket(family) as client:
            client.connect(server.getsockname()[:2])
            accepted, _ = server.accept()
            with accepted:
                ends = (accepted.getpeername()[:2], accepted.getsockname()[:2])
                assert peer_uid(*ends) == os.getuid()
    assert peer_uid(*ends) is None  # closed: no longer listed as established


def test_the_pages_answer_only_their_owners_connections_and_roots():
    uids = {("127.0.0.1", 1): 1001, ("127.0.0.1", 2): 0, ("127.0.0.1", 3): 1002}
    # as `run` starts its own collector: its user's page, actions opted in (--allow-unauthenticated-actions)
    access = BrowserAccess(NoAuth(), owner_uid=1001, peer_uid=lambda client, server: uids.get(client),
                           unauthenticated_actions=True)

    def browser(port: int | None):
        environ = {"REMOTE_ADDR": "127.0.0.1"}
        if port is not None:
            environ[PEER_KEY] = (("127.0.0.1", port), ("127.0.0.1", 9752))
        return access.browser(environ)

    for port in (1, 2):
        b = browser(port)
        assert not b.refused and b.may_see("alice") and b.why_not_act("alice", True) == ""
    for port in (3, 4, None):  # another user; a connection the table does not list; no ends said
        b = browser(port)
        assert b.refused == NOT_THE_OWNERS and not b.may_see("alice") and b.why_not_act("alice", True)
    assert access.other_users == 3
    # not opted in: the owner's connection sees the job and may not act on it
    seeing = BrowserAccess(NoAuth(), owner_uid=1001, peer_uid=lambda client, server: uids.get(client))
    b = seeing.browser({"REMOTE_ADDR": "127.0.0.1", PEER_KEY: (("127.0.0.1", 1), ("127.0.0.1", 9752))})
    assert not b.refused and b.may_see("alice") and "--allow-unauthenticated-actions" in b.why_not_act("alice", True)
    # without an owner: anyone's, as before
    assert not BrowserAccess(NoAuth(), peer_uid=lambda c, s: 1002).browser({}).refused


def test_an_owner_uid_off_loopback_is_refused_in_one_line(tmp_path):
    from tests.support.helpers import cli

    r = cli("collector", "--web-listen", "0.0.0.0:0", "--web-owner-uid", "1000", "--db", str(tmp_path / "db"),
            timeout=30)
    assert r.returncode == 2 and "--web-owner-uid" in r.stderr and "loopback" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
