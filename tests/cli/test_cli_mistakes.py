"""User mistakes get one line that says what is wrong, never a traceback (real processes)."""
from __future__ import annotations

import pytest

from tests.support.helpers import Collector, cli

pytestmark = pytest.mark.e2e


def one_line(r, code: int, *words: str) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == code, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip() and not x.startswith(("Usage:", "Try "))]
    assert len(lines) == 1, r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("option,value,words", [
    ("--listen", "nonsense", ("'nonsense' has no port",)),
    ("--listen", "127.0.0.1:99999", ("port 99999 is out of range",)),
    ("--listen", "127.0.0.1:http", ("not a number",)),
    ("--listen", "no-such-host.invalid:50051", ("cannot resolve the host 'no-such-host.invalid'",)),
    ("--listen", "::1:50051", ("IPv6 address in brackets",)),
    ("--metrics-listen", "127.0.0.1:70000", ("--metrics-listen", "out of range")),
    ("--query-listen", "127.0.0.1", ("--query-listen", "has no port")),
])
def test_collector_with_a_bad_address_says_so(tmp_path, option, value, words):
    r = cli("collector", option, value, "--db", str(tmp_path / "db"), timeout=30)
    one_line(r, 2, *words)


@pytest.mark.parametrize("command", ["run", "demo"])
def test_keep_in_a_folder_that_cannot_be_made(command):
    args = ["--", "true"] if command == "run" else []
    r = cli(command, "--keep", "/proc/nope", *args, timeout=30)
    one_line(r, 2, "cannot use --keep /proc/nope")


@pytest.mark.parametrize("address,words", [
    ("127.0.0.1", ("has no port",)),
    ("127.0.0.1:0", ("out of range",)),
    ("127.0.0.1:99999", ("out of range",)),
    ("no-such-host.invalid:50051", ("cannot resolve the host 'no-such-host.invalid'",)),
])
@pytest.mark.parametrize("command", [["status", "42"], ["jobs"], ["alerts"]])
def test_query_commands_with_a_bad_collector_address(command, address, words):
    r = cli(*command, "--collector", address, timeout=30)
    one_line(r, 2 if "resolve" not in words[0] else 1, *words)


def test_status_against_the_metrics_port_says_which_port_it_is(tmp_path):
    col = Collector(tmp_path)
    try:
        r = cli("status", "42", "--collector", f"127.0.0.1:{col.metrics_port}", timeout=30)
        one_line(r, 1, "looks like the collector's /metrics port")
        r = cli("status", "42", "--collector", col.address, timeout=30)  # the right port: a different answer
        one_line(r, 1, "unknown to this collector")
    finally:
        col.stop()
