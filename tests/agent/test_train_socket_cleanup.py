"""Issue 17 item 15: the agent removes its training socket on every way out (SIGTERM, SIGINT, an error),
and a training socket path too long for a Unix socket is one clear line, not "strerror None"."""
from __future__ import annotations

import signal
import subprocess
import threading
from pathlib import Path

import pytest
from clusterwatch.agent.config import AgentConfig
from clusterwatch.agent.runtime import AgentRuntime

from clusterwatch.errors import ConfigError
from tests.support.helpers import CLI, Collector, Proc, clean_environ, wait_for


def _agent(tmp_path: Path, collector: Collector, sock: Path) -> Proc:
    return Proc([*CLI, "agent", "--collector", collector.address, "--node", "n1", "--interval", "0.2",
                 "--gpu-source", "none", "--no-provenance", "--kmsg", "none", "--spool-dir", str(tmp_path / "spool"),
                 "--train-socket", str(sock)], tmp_path / "agent.log")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_agent_leaves_no_train_socket(tmp_path: Path, sig: signal.Signals) -> None:
    collector = Collector(tmp_path)
    sock = tmp_path / "run" / "train.sock"
    agent = _agent(tmp_path, collector, sock)
    try:
        wait_for(lambda: "agent on n1" in agent.text(), timeout=30, what="the agent running")
        assert sock.is_socket()
        code = agent.stop(sig)
    finally:
        agent.stop()
        collector.stop()
    assert code == 0, agent.text()
    assert not sock.exists(), "the train socket was left behind"
    assert "Traceback" not in agent.text()


def test_a_run_ended_by_an_error_leaves_no_train_socket(tmp_path: Path) -> None:
    sock = tmp_path / "train.sock"
    config = AgentConfig(collector="127.0.0.1:9", node="n1", interval_s=0.2, gpu_source="none",
                         spool_dir=str(tmp_path / "spool"), train_socket=str(sock), provenance=False, kmsg=None)
    runtime = AgentRuntime.from_config(config)
    assert sock.is_socket()

    class Broken(threading.Event):
        def is_set(self) -> bool:  # an error inside the run, past the per-poll guard
            raise RuntimeError("broken")

    with pytest.raises(RuntimeError, match="broken"):
        runtime.run(Broken())
    assert not sock.exists(), "the train socket was left behind"


def test_a_train_socket_path_too_long_is_one_clear_line(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    sock = deep / "train.sock"
    size = len(str(sock).encode())
    assert size > 107
    out = subprocess.run([*CLI, "agent", "--collector", "127.0.0.1:9", "--node", "n1", "--gpu-source", "none",
                          "--no-provenance", "--kmsg", "none", "--spool-dir", str(tmp_path / "spool"),
                          "--train-socket", str(sock)], capture_output=True, text=True, timeout=60,
                         env=clean_environ())
    assert out.returncode == 2
    [line] = out.stderr.splitlines()
    assert f"is {size} bytes; a Unix socket path is at most 107" in line
    assert "--train-socket" in line and "None" not in line
    # nor a path of exactly the limit refused
    ok = tmp_path / ("f" * (107 - len(str(tmp_path)) - 1))
    assert len(str(ok).encode()) == 107
    from clusterwatch.agent.train_endpoint import TrainEndpoint

    endpoint = TrainEndpoint(str(ok))
    endpoint.start()
    endpoint.close()
    with pytest.raises(ConfigError, match="at most 107"):
        TrainEndpoint(str(ok) + "g").start()
