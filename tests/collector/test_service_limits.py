"""The collector's gRPC port under connections that never speak, and against a second collector on its port."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from tests.support.helpers import AGENT_METADATA, CLI, Collector, Proc, cli, metric_value, wait_for

pytestmark = pytest.mark.e2e

SLEEPER = "import time; time.sleep(600)"
FD_LIMIT = 256
IDLE_CONNECTIONS = 400


class LimitedCollector(Proc):
    """A real collector whose open-file limit (soft and hard) is `nofile`, as a small ulimit leaves it."""

    def __init__(self, tmp, nofile: int, *extra: str, name: str = "collector") -> None:
        self.ports_file = tmp / f"{name}-ports.json"
        super().__init__(["prlimit", f"--nofile={nofile}:{nofile}", "--", *CLI, "collector", "--listen",
                          "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--query-auth", "none",
                          "--db", str(tmp / f"{name}.db"), "--ports-file", str(self.ports_file), *extra],
                         tmp / f"{name}.log")
        wait_for(lambda: self.ports_file.exists() or self.popen.poll() is not None, what="collector ports")
        if self.popen.poll() is not None:
            raise AssertionError(f"collector exited: {self.text()}")
        ports = json.loads(self.ports_file.read_text())
        self.grpc_port, self.metrics_port = ports["grpc"], ports["metrics"]

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            return r.read().decode()


def _open_idle(port: int, n: int) -> list[socket.socket]:
    """n TCP connections that never send a byte (no TLS, no HTTP/2 preface)."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.settimeout(5)
        s.connect(("127.0.0.1", port))
        socks.append(s)
    return socks


def _closed_by_peer(s: socket.socket) -> bool:
    """Whether the collector closed this connection (what it sent first, its HTTP/2 settings, read past)."""
    s.setblocking(False)
    try:
        while s.recv(65536):
            pass
        return True
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def test_idle_connections_do_not_lock_agents_out(tmp_path):
    collector = LimitedCollector(tmp_path, FD_LIMIT)
    sleeper = Proc([sys.executable, "-c", SLEEPER], tmp_path / "sleeper.log")
    idle = _open_idle(collector.grpc_port, IDLE_CONNECTIONS)
    agent = None
    try:
        # the collector keeps descriptors for everything else: /metrics still answers
        assert metric_value(collector.metrics(), "clusterwatch_ingest_samples_total") == 0
        agent = Proc([*CLI, "agent", "--collector", f"127.0.0.1:{collector.grpc_port}", "--node", "idle-node",
                      "--interval", "0.3", "--gpu-source", "none", "--pid", str(sleeper.pid), "--job-id", "idle-1",
                      "--no-provenance", "--spool-dir", str(tmp_path / "spool"), "--train-socket",
                      str(tmp_path / "agent.sock")], tmp_path / "agent.log")
        started = time.monotonic()
        try:
            wait_for(lambda: (metric_value(collector.metrics(), "clusterwatch_ingest_samples_total") or 0) > 0,
                     timeout=60, interval=0.5, what="the agent's samples past 400 idle connections")
        except AssertionError:
            raise AssertionError(f"agent: {agent.text()[-2000:]}\ncollector: {collector.text()[-2000:]}") from None
        print(f"agent's first samples after {time.monotonic() - started:.1f} s")
        # the connections that never spoke were closed by the collector, not left to hold descriptors
        assert sum(_closed_by_peer(s) for s in idle) == IDLE_CONNECTIONS
        assert collector.popen.poll() is None
    finally:
        for s in idle:
            s.close()
        for p in (agent, sleeper, collector):
            if p is not None:
                p.stop()


def test_a_stream_that_never_says_hello_is_closed(tmp_path):
    import grpc
    from clusterwatch.collector.ingest.service import HELLO_TIMEOUT_S
    from clusterwatch.v1 import agent_pb2_grpc

    collector = LimitedCollector(tmp_path, FD_LIMIT)
    channel = grpc.insecure_channel(f"127.0.0.1:{collector.grpc_port}")
    try:
        def silence():
            time.sleep(HELLO_TIMEOUT_S + 60)  # an open stream that sends nothing
            yield from ()

        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            list(agent_pb2_grpc.IngestStub(channel).Stream(silence(), metadata=AGENT_METADATA,
                                                           timeout=HELLO_TIMEOUT_S + 30))
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "no hello within" in err.value.details()
        assert time.monotonic() - started < HELLO_TIMEOUT_S + 20
        assert (metric_value(collector.metrics(), "clusterwatch_ingest_rejected_total") or 0) == 1
    finally:
        channel.close()
        collector.stop()


@pytest.mark.parametrize("flag", ["--listen", "--query-listen"])
def test_a_second_collector_on_a_taken_port_says_so_and_exits(tmp_path, flag):
    first = Collector(tmp_path, "--query-listen", "127.0.0.1:0", name="first")
    try:
        ports = json.loads(first.ports_file.read_text())
        taken = ports["grpc"] if flag == "--listen" else ports["query"]
        args = [*CLI, "collector", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                "--query-auth", "none", "--db", str(tmp_path / "second.db"), flag, f"127.0.0.1:{taken}"]
        second = subprocess.run(args, capture_output=True, text=True, timeout=60)
        assert second.returncode != 0
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"cannot listen on 127.0.0.1:{taken}: the port is in use" in lines[0], lines
        assert flag in lines[0]
        # the first one keeps its port, and answers
        assert cli("jobs", "--collector", first.address).returncode == 0
        assert first.popen.poll() is None
    finally:
        first.stop()
