"""Agents authenticated by munge, as on any Slurm node: root's credential, made for an agent, its node bound to
the host that made it. A real munged (two, with one key: two hosts), a real collector and agent."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from clusterwatch.agent.munge_credential import AGENT_PAYLOAD as AGENTS_OWN
from clusterwatch.cli.common import MUNGE_PAYLOAD
from clusterwatch.collector.ingest.agent_auth import AGENT_PAYLOAD
from clusterwatch.v1 import agent_pb2, agent_pb2_grpc

from tests.support.helpers import CLI, Collector, Proc, cli, metric_value, unique_job_id, wait_for

pytestmark = pytest.mark.e2e


def test_the_agent_and_the_collector_agree_on_the_payload():
    assert AGENTS_OWN.encode() == AGENT_PAYLOAD != MUNGE_PAYLOAD.encode()


def _credential(sock: Path, payload: str, user: str = "root") -> str:
    args = ["munge", "-s", payload, f"--socket={sock}"]
    if user != "root":
        args = ["runuser", "-u", user, "--", *args]
    return subprocess.run(args, capture_output=True, text=True, timeout=30, check=True).stdout.strip()


def _hello(address: str, node: str, cred: str | None) -> tuple[grpc.StatusCode, str]:
    metadata = [("x-clusterwatch-munge", cred)] if cred else None
    with grpc.insecure_channel(address) as channel:
        msgs = iter([agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=node, boot_id=f"raw-{node}"))])
        try:
            list(agent_pb2_grpc.IngestStub(channel).Stream(msgs, metadata=metadata, timeout=15))
        except grpc.RpcError as exc:
            return exc.code(), exc.details()
    return grpc.StatusCode.OK, ""


def _second_host(sock: Path, tmp: Path) -> tuple[Path, int]:
    """A munged with the same key whose credentials say another origin (127.0.0.2): another node's host."""
    root = Path(os.path.dirname(sock))
    other = Path(tmp) / "m2"
    other.mkdir()
    sock2 = other / "s"
    subprocess.run(["/usr/sbin/munged", f"--socket={sock2}", f"--key-file={root / 'munge.key'}",
                    f"--pid-file={other / 'pid'}", f"--log-file={other / 'log'}", f"--seed-file={other / 'seed'}",
                    "--origin=127.0.0.2", "--force"], check=True, timeout=20)
    wait_for(lambda: (other / "pid").exists() and sock2.exists(), what="the second munged")
    return sock2, int((other / "pid").read_text())


def test_agents_prove_root_with_munge_and_a_node_is_bound_to_its_host(tmp_path, munged):
    collector = Collector(tmp_path, "--agent-auth", "munge", "--munge-socket", str(munged))
    sleeper = Proc([sys.executable, "-c", "import time; time.sleep(600)"], tmp_path / "sleeper.log")
    job = unique_job_id()
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "mn1", "--interval", "0.3",
                  "--gpu-source", "none", "--pid", str(sleeper.pid), "--job-id", job, "--no-provenance",
                  "--agent-auth", "munge", "--munge-socket", str(munged), "--spool-dir", str(tmp_path / "spool"),
                  "--train-socket", str(tmp_path / "a.sock")], tmp_path / "agent.log")
    other_pid = None
    try:
        def owner() -> str | None:
            r = cli("status", job, "--json", "--collector", collector.address)
            return json.loads(r.stdout)["job"]["user"] if r.returncode == 0 else None

        # root's agent, proved by munge: its samples name the job's owner (the uid the kernel gives the sleeper)
        wait_for(lambda: owner() == "root", what="the job owned as the authenticated agent reads it")
        assert "x-clusterwatch-munge" not in collector.text()
        # no credential, another user's, a query's: refused, counted, each said in one line
        code, details = _hello(collector.address, "mn9", None)
        assert code == grpc.StatusCode.UNAUTHENTICATED and "munge credential" in details
        code, details = _hello(collector.address, "mn9", _credential(munged, AGENT_PAYLOAD.decode(), "nobody"))
        assert code == grpc.StatusCode.PERMISSION_DENIED and "not root's" in details
        code, details = _hello(collector.address, "mn9", _credential(munged, MUNGE_PAYLOAD))
        assert code == grpc.StatusCode.UNAUTHENTICATED and "not made for a clusterwatch agent" in details
        # a replayed credential
        cred = _credential(munged, AGENT_PAYLOAD.decode())
        assert _hello(collector.address, "mn8", cred)[0] == grpc.StatusCode.OK
        assert _hello(collector.address, "mn8", cred)[0] == grpc.StatusCode.UNAUTHENTICATED
        # root on another host may not speak for mn1 (bound to the first host), but for a node of its own
        sock2, other_pid = _second_host(munged, tmp_path)
        code, details = _hello(collector.address, "mn1", _credential(sock2, AGENT_PAYLOAD.decode()))
        assert code == grpc.StatusCode.PERMISSION_DENIED and "bound to the host" in details, details
        assert _hello(collector.address, "mn7", _credential(sock2, AGENT_PAYLOAD.decode()))[0] == grpc.StatusCode.OK
        code, details = _hello(collector.address, "mn7", _credential(munged, AGENT_PAYLOAD.decode()))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert (metric_value(collector.metrics(), "clusterwatch_ingest_unauthenticated_total") or 0) >= 5
        assert owner() == "root" and "Traceback" not in collector.text()
    finally:
        if other_pid is not None:
            os.kill(other_pid, 15)
        for p in (agent, sleeper, collector):
            p.stop()


def test_auto_refuses_agents_while_munged_is_down(tmp_path):
    # munge installed here (the suite's host has it), its daemon not at the socket: streams wait for it
    collector = Collector(tmp_path, "--agent-auth", "auto", "--munge-socket", str(tmp_path / "no-munged"))
    try:
        code, details = _hello(collector.address, "n1", None)
        assert code == grpc.StatusCode.UNAVAILABLE and "munge does not work" in details
        assert len([line for line in collector.text().splitlines() if "agents' streams are refused" in line]) == 1
    finally:
        collector.stop()
