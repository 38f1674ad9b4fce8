"""Who is asking: munge credentials on the query service, against a real munged and a real collector."""
from __future__ import annotations

import json
import subprocess
import sys

import grpc
import pytest
from clusterwatch.cli.common import MUNGE_PAYLOAD
from clusterwatch.collector.query_auth import QUERY_PAYLOAD
from clusterwatch.v1 import query_pb2, query_pb2_grpc

from .helpers import CLI, Collector, Proc, cli, metric_value, wait_for

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
