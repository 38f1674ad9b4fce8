"""Who is asking: munge credentials on the query service, against a real munged and a real collector."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc
import pytest
from clusterwatch.cli.common import MUNGE_PAYLOAD
from clusterwatch.collector.queries.auth import QUERY_PAYLOAD, AuthError, check_payload, parse_unmunge
from clusterwatch.v1 import query_pb2, query_pb2_grpc
from hypothesis import given
from hypothesis import strategies as st

from tests.support.helpers import CLI, Collector, Proc, cli, metric_value, wait_for

pytestmark = pytest.mark.e2e

SLEEPER = "import time; time.sleep(600)"
JOB = "qa-1"


def _munge_as(user: str, munged, *args: str) -> str:
    """A real credential made by `user` (munge's own uid check, as on a login node)."""
    return subprocess.run(["runuser", "-u", user, "--", "munge", f"--socket={munged}", *args],
                          capture_output=True, text=True, timeout=30, check=True).stdout.strip()


def _agent(tmp_path, collector, pid):
    return Proc([*CLI, "agent", "--collector", collector.address, "--node", "qa-node", "--interval", "0.3",
                 "--gpu-source", "none", "--pid", str(pid), "--job-id", JOB, "--no-provenance",
                 "--spool-dir", str(tmp_path / "spool"), "--train-socket", str(tmp_path / "agent.sock")],
                tmp_path / "agent.log")


def _rpc_code(call, cred: str) -> tuple[grpc.StatusCode, str]:
    try:
        call(metadata=[("x-clusterwatch-munge", cred)])
    except grpc.RpcError as err:
        return err.code(), err.details()
    return grpc.StatusCode.OK, ""


def test_the_cli_and_the_collector_agree_on_the_payload():
    assert MUNGE_PAYLOAD.encode() == QUERY_PAYLOAD


def test_a_forged_payload_makes_nobody_root(tmp_path, munged):
    """`munge -s "x\\nUID: root (0)"` as nobody: refused on both ports, not read as root's credential."""
    collector = Collector(tmp_path, "--query-auth", "munge", "--munge-socket", str(munged),
                          "--query-listen", "127.0.0.1:0")
    sleeper = Proc([sys.executable, "-c", SLEEPER], tmp_path / "sleeper.log")
    agent = _agent(tmp_path, collector, sleeper.pid)
    env = {"CLUSTERWATCH_MUNGE_SOCKET": str(munged)}
    try:
        wait_for(lambda: (metric_value(collector.metrics(), "clusterwatch_ingest_samples_total") or 0) > 0,
                 what="samples")
        query_port = json.loads(collector.ports_file.read_text())["query"]
        for address in (collector.address, f"127.0.0.1:{query_port}"):
            # the CLI (root here) still gets its answer: it sends the payload the collector wants
            r = cli("status", JOB, "--collector", address, "--json", env=env)
            assert r.returncode == 0, r.stderr
            assert json.loads(r.stdout)["job"]["user"] == "root"
            channel = grpc.insecure_channel(address)
            stub = query_pb2_grpc.QueryStub(channel)

            def get_job(metadata, stub=stub):
                return stub.GetJob(query_pb2.GetJobRequest(job_id=JOB), timeout=10, metadata=metadata)

            def list_jobs(metadata, stub=stub):
                return stub.ListJobs(query_pb2.ListJobsRequest(include_ended=True), timeout=10, metadata=metadata)

            for payload in ("x\nUID: root (0)", f"{MUNGE_PAYLOAD}\nUID: root (0)",
                            "x\n\nSTATUS: Success (0)\nUID: root (0)"):
                for call in (get_job, list_jobs):
                    code, details = _rpc_code(call, _munge_as("nobody", munged, "-s", payload))
                    assert code == grpc.StatusCode.UNAUTHENTICATED, (address, payload, code, details)
                    assert "not made for a clusterwatch query" in details
            # a credential made for something else (no payload: `munge -n`) is not a query's either
            code, _ = _rpc_code(get_job, _munge_as("nobody", munged, "-n"))
            assert code == grpc.StatusCode.UNAUTHENTICATED
            # nobody's honest credential is nobody's: root's job is refused, the list is empty
            code, _ = _rpc_code(get_job, _munge_as("nobody", munged, "-s", MUNGE_PAYLOAD))
            assert code == grpc.StatusCode.PERMISSION_DENIED
            jobs = list_jobs([("x-clusterwatch-munge", _munge_as("nobody", munged, "-s", MUNGE_PAYLOAD))])
            assert list(jobs.jobs) == []
            channel.close()
        assert (metric_value(collector.metrics(), "clusterwatch_ingest_unauthenticated_total") or 0) >= 14
        assert collector.popen.poll() is None
    finally:
        for p in (agent, sleeper, collector):
            p.stop()


def test_auto_refuses_queries_while_munge_is_down_and_takes_munged_when_it_comes_up(tmp_path, munged):
    """munge installed, munged not answering at start: queries refused with one line, never open to all."""
    # munged "comes up" when this link to the fixture's socket appears (a short path: sockets stay under 108)
    link = Path(tempfile.mkdtemp(prefix="cw-qa-", dir="/tmp")) / "munge.socket"
    collector = Collector(tmp_path, "--query-auth", "auto", "--munge-socket", str(link))
    sleeper = Proc([sys.executable, "-c", SLEEPER], tmp_path / "sleeper.log")
    agent = _agent(tmp_path, collector, sleeper.pid)
    env = {"CLUSTERWATCH_MUNGE_SOCKET": str(link)}
    try:
        wait_for(lambda: (metric_value(collector.metrics(), "clusterwatch_ingest_samples_total") or 0) > 0,
                 what="samples")
        for args in (("status", JOB), ("jobs",)):
            r = cli(*args, "--collector", collector.address, env=env)
            assert r.returncode == 1, r.stdout
            assert len(r.stderr.strip().splitlines()) == 1 and "munge does not work on its host" in r.stderr
            assert JOB not in r.stdout
        warnings = [line for line in collector.text().splitlines() if "munge" in line]
        assert len(warnings) == 1 and "queries are refused until it does" in warnings[0], warnings
        link.symlink_to(munged)
        r = wait_for(lambda: (lambda r: r if r.returncode == 0 else None)(
            cli("status", JOB, "--collector", collector.address, "--json", env=env)),
            timeout=60, interval=1.0, what="munged picked up")
        assert json.loads(r.stdout)["job"]["user"] == "root"
        assert "munge works on this host now" in collector.text()
        # identified from then on: a credential of nobody's is nobody's
        channel = grpc.insecure_channel(collector.address)
        cred = _munge_as("nobody", munged, "-s", MUNGE_PAYLOAD)
        jobs = query_pb2_grpc.QueryStub(channel).ListJobs(query_pb2.ListJobsRequest(), timeout=10,
                                                         metadata=[("x-clusterwatch-munge", cred)])
        assert list(jobs.jobs) == []
        channel.close()
    finally:
        for p in (agent, sleeper, collector):
            p.stop()
        shutil.rmtree(link.parent, ignore_errors=True)


def test_awaiting_munge_tries_again_no_more_often_than_its_interval():
    import asyncio

    from clusterwatch.collector.queries.auth import AuthError, AwaitingMunge, Caller

    now = [100.0]
    answers = [False, True]
    tries = []

    async def works():
        tries.append(now[0])
        return answers.pop(0)

    class Identified:
        async def caller(self, metadata):
            return Caller(1000, "alice", admin=False)

    auth = AwaitingMunge(Identified(), works, retry_s=5.0, clock=lambda: now[0])

    async def ask():
        try:
            return await auth.caller(())
        except AuthError as exc:
            return str(exc)

    async def scenario():
        out = [await ask()]          # just after the failed start-up check: no new try yet
        now[0] = 105.0
        out.append(await ask())      # a try; munge still down
        now[0] = 107.0
        out.append(await ask())      # within the interval: no try
        now[0] = 110.0
        out.append(await ask())      # a try; munge works
        now[0] = 111.0
        out.append(await ask())      # identified from then on, no more tries
        return out

    out = asyncio.run(scenario())
    assert tries == [105.0, 110.0]
    assert all("munge does not work" in o for o in out[:3])
    assert out[3] == out[4] == Caller(1000, "alice", admin=False)


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
