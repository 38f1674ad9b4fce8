"""`unix:PATH` addresses: the collector listens on one, the CLI and the agent reach it (real processes)."""
from __future__ import annotations

import socket
import subprocess

import pytest
from clusterwatch.collector.serving.listen_check import taken_error

from clusterwatch.unix_address import unix_path
from tests.cli.test_cli_mistakes import one_line
from tests.support.helpers import CLI, clean_environ, cli, wait_for

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("address,path", [
    ("unix:/tmp/a.sock", "/tmp/a.sock"),
    ("unix:///tmp/a.sock", "/tmp/a.sock"),
    ("unix:rel.sock", "rel.sock"),
    ("127.0.0.1:50051", None),
    ("[::1]:50051", None),
])
def test_unix_path_reads_addresses_as_grpc_does(address, path):
    assert unix_path(address) == path


def test_a_socket_nobody_answers_on_is_replaced_and_a_live_one_is_in_use(tmp_path):
    path = tmp_path / "c.sock"
    live = socket.socket(socket.AF_UNIX)
    live.bind(str(path))
    live.listen()
    assert "answers on it" in taken_error(f"unix:{path}", "--listen")
    live.close()  # the file stays: what a killed collector leaves
    assert path.exists()
    assert taken_error(f"unix:{path}", "--listen") is None
    assert not path.exists()
    path.write_text("not a socket")
    assert "is not a socket" in taken_error(f"unix:{path}", "--listen")


@pytest.mark.parametrize("value,words", [
    ("unix:/no/such/folder/c.sock", ("the folder /no/such/folder does not exist",)),
    ("unix:", ("has no path",)),
    ("unix:/" + "x" * 120, ("at most 107 bytes",)),
])
def test_collector_with_a_bad_unix_listen_says_so(tmp_path, value, words):
    r = cli("collector", "--listen", value, "--db", str(tmp_path / "db"), timeout=30)
    one_line(r, 2, *words)


def test_metrics_listen_takes_tcp_only(tmp_path):
    r = cli("collector", "--metrics-listen", f"unix:{tmp_path}/m.sock", "--db", str(tmp_path / "db"), timeout=30)
    one_line(r, 2, "/metrics is served on TCP only")


def test_a_second_collector_on_a_live_socket_says_it_is_in_use(tmp_path):
    address = f"unix:{tmp_path}/c.sock"
    first = subprocess.Popen([*CLI, "collector", "--listen", address, "--metrics-listen", "none",
                              "--query-auth", "none", "--db", str(tmp_path / "a.db")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=clean_environ())
    try:
        wait_for(lambda: (tmp_path / "c.sock").exists(), what="the first collector's socket")
        r = cli("collector", "--listen", address, "--metrics-listen", "none", "--query-auth", "none",
                "--db", str(tmp_path / "b.db"), timeout=30)
        one_line(r, 2, "answers on it")
        r = cli("status", "42", "--collector", address, timeout=30)  # the CLI reaches it through the socket
        one_line(r, 1, "unknown to this collector")
    finally:
        first.terminate()
        first.wait(30)


def test_status_on_a_socket_nobody_serves_says_it_does_not_answer(tmp_path):
    r = cli("status", "42", "--collector", f"unix:{tmp_path}/none.sock", timeout=30)
    one_line(r, 1, "does not answer")
    r = cli("status", "42", "--collector", "unix:", timeout=30)
    one_line(r, 2, "has no path")
