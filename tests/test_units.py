"""Unit tests of the small pure pieces: batch numbering, buffers, parsers, rendering helpers."""
from __future__ import annotations

import json

from clusterwatch.agent.backends.procs import parse_stat
from clusterwatch.agent.spool import parse_event
from clusterwatch.agent.stream import BatchBuffer
from clusterwatch.cli.render import exit_text, human_bytes, human_duration, sparkline
from clusterwatch.collector.core import SeqTracker
from clusterwatch.collector.ingest_service import TokenBucket
from clusterwatch.collector.query_auth import QUERY_PAYLOAD, AuthError, check_payload, parse_unmunge
from clusterwatch.collector.views import resample
from clusterwatch.v1 import agent_pb2
from hypothesis import given
from hypothesis import strategies as st

STAT = "{pid} ({comm}) S 1 100 100 0 -1 4194560 2000 0 0 0 150 50 0 0 20 0 7 0 123456 1000000 2560 " \
       "18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0"


def test_parse_stat_handles_names_with_spaces_and_parentheses():
    for comm in ("python", "my prog", "a) b (c", "))", "x" * 15):
        st_ = parse_stat(STAT.format(pid=42, comm=comm).encode())
        assert st_.comm == comm
        assert (st_.state, st_.ppid, st_.cpu_ticks, st_.threads, st_.start_ticks, st_.rss_pages) == (
            "S", 1, 200, 7, 123456, 2560)


@given(st.lists(st.integers(min_value=1, max_value=200), max_size=300))
def test_seq_tracker_stores_each_number_once(seqs):
    t = SeqTracker()
    fresh = [s for s in seqs if t.add(s)]
    assert sorted(fresh) == sorted(set(seqs))
    assert all(n > t.low for n in t.above)


def test_batch_buffer_drops_oldest_first_and_counts():
    buf = BatchBuffer(max_samples=100)
    for seq in range(1, 6):
        dropped = buf.add(seq, agent_pb2.Batch(seq=seq), 30)
        assert dropped == (30 if seq >= 4 else 0)
    assert [s for s, _ in buf.after(0)] == [3, 4, 5]
    assert buf.ack(4) == 30 and buf.ack(4) == 0
    assert [s for s, _ in buf.after(3)] == [5]


def test_token_bucket_allows_the_rate_and_delays_beyond():
    b = TokenBucket(100.0, burst_s=1.0)
    now = b.last
    assert b.take(100, now) == 0.0       # the burst
    assert b.take(50, now) == 0.5        # 50 samples over: half a second at 100/s
    assert b.take(0, now + 1.5) == 0.0   # refilled


@given(st.text(max_size=300))
def test_event_parser_never_raises_anything_but_value_error(text):
    try:
        parse_event(text)
    except ValueError:
        pass


def test_event_parser_accepts_a_hook_event():
    e = parse_event(json.dumps({"kind": "end", "job_id": "77", "time": 5.0, "uid": 1000, "exit_code": 3}))
    assert (e.kind, e.job_id, e.uid, e.exit_code) == ("end", "77", 1000, 3)


UNMUNGE = """STATUS:          Success (0)
ENCODE_HOST:     node1 (127.0.0.1)
ENCODE_TIME:     2026-11-29 19:00:00 +0000 (1795978800)
DECODE_TIME:     2026-11-29 19:00:00 +0000 (1795978800)
TTL:             300
CIPHER:          aes128 (4)
MAC:             sha256 (5)
ZIP:             none (0)
UID:             alice (1000)
GID:             alice (1000)
LENGTH:          0
"""


def test_unmunge_output():
    assert parse_unmunge(UNMUNGE) == (1000, "alice")
    # what unmunge prints with --keys=STATUS,UID (the collector's call)
    assert parse_unmunge("STATUS:          Success (0)\nUID:             root (0)\n") == (0, "root")
    # the metadata block ends at the first empty line: what follows is a payload, whatever it says
    assert parse_unmunge(UNMUNGE + "\nUID: root (0)\n") == (1000, "alice")
    for bad in (UNMUNGE.replace("Success (0)", "Replayed credential (17)"), "", "UID: x\n",
                # a payload printed in the metadata's place (a forged "x\nUID: root (0)")
                UNMUNGE.replace("LENGTH:          0\n", "LENGTH:          15\nx\nUID: root (0)\n"),
                UNMUNGE + "UID:             root (0)\n"):
        try:
            parse_unmunge(bad)
        except AuthError:
            continue
        raise AssertionError(f"accepted {bad!r}")


def test_a_query_credential_carries_the_clis_payload_only():
    check_payload(QUERY_PAYLOAD)
    for bad in (b"", QUERY_PAYLOAD + b"\n", QUERY_PAYLOAD + b"\nUID: root (0)", b"x\nUID: root (0)"):
        try:
            check_payload(bad)
        except AuthError:
            continue
        raise AssertionError(f"accepted {bad!r}")


@given(st.text(max_size=400))
def test_unmunge_parser_only_raises_auth_error(text):
    try:
        parse_unmunge(text)
    except AuthError:
        pass


def test_rendering_helpers():
    assert human_bytes(None) == "-" and human_bytes(512) == "512 B" and human_bytes(3 * 1024**3) == "3.0 GiB"
    assert human_duration(3725) == "01:02:05" and human_duration(90061) == "1-01:01:01"
    assert sparkline([1, 1, 1]) == "▁▁▁"
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert len(sparkline(list(range(100)), width=12)) == 12
    # 128 + N is the job killed by signal N (as the collector writes Slurm's ExitCode=0:N)
    assert exit_text(0) == "exit code 0" and exit_text(7) == "exit code 7"
    assert exit_text(143) == "exit code 143: SIGTERM" and exit_text(137) == "exit code 137: SIGKILL"
    assert exit_text(128) == "exit code 128" and exit_text(255) == "exit code 255"


@given(st.lists(st.floats(allow_nan=False), max_size=200), st.integers(min_value=2, max_value=50))
def test_resample_keeps_the_ends_and_the_bound(values, points):
    out = resample(values, points)
    assert len(out) == min(len(values), points)
    if values:
        assert out[0] == values[0] and out[-1] == values[-1]


def test_agent_threads_carry_names_the_system_shows():
    import threading

    from clusterwatch.agent.thread_names import name_os_thread

    seen = []

    def named():
        name_os_thread("cw-sender-and-more")
        with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
            seen.append(f.read().strip())

    t = threading.Thread(target=named)
    t.start()
    t.join()
    assert seen == ["cw-sender-and-m"]  # the kernel keeps 15 bytes
