"""AgentRuntime: the agent's life in the agent package (sources, stream, last poll, flush, close), in process."""
from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from clusterwatch.agent.config import AgentConfig
from clusterwatch.agent.runtime import AgentRuntime, SpoolTaken
from clusterwatch.agent.stream import Sender
from clusterwatch.v1 import agent_pb2

from clusterwatch.errors import ConfigError
from tests.support.helpers import AGENT_TOKEN, Collector, metric_value, wait_for


def _config(tmp_path, collector: str | None, pid: int, **kw) -> AgentConfig:
    return AgentConfig(collector=collector, node="rt-node", interval_s=0.2, send_interval_s=0.0, gpu_source="none",
                       pids=((pid, None),), local_job_id="rt-1", spool_dir=str(tmp_path / "spool"),
                       train_socket=str(tmp_path / "train.sock"), provenance=False,
                       **{"token": AGENT_TOKEN, **kw})  # the harness's collectors take the tests' token


@pytest.fixture
def sleeper():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield p
    p.kill()
    p.wait()


def test_sender_submit_stamps_its_counters_on_the_batch():
    """The counters a batch carries are the sender's own, taken under its lock: no caller reaches in."""
    sender = Sender("127.0.0.1:1", agent_pb2.Hello, max_buffer_samples=10)
    first, second = agent_pb2.Batch(), agent_pb2.Batch()
    sender.submit(first, 8, read_errors=3)
    sender.submit(second, 8, read_errors=4)  # the buffer holds 10: the first batch's 8 are dropped
    assert (first.counters.samples_sent, first.counters.samples_dropped, first.counters.buffered_batches,
            first.counters.read_errors) == (8, 0, 0, 3)
    assert (second.counters.samples_sent, second.counters.samples_dropped, second.counters.buffered_batches,
            second.counters.read_errors) == (16, 0, 1, 4)
    assert sender.counters.samples_dropped == 8 and (first.seq, second.seq) == (1, 2)


@pytest.mark.parametrize("process_source", ["proc", "psutil"])
def test_run_streams_until_stopped_then_flushes_and_closes(tmp_path, sleeper, process_source):
    collector = Collector(tmp_path)
    try:
        runtime = AgentRuntime.from_config(_config(tmp_path, collector.address, sleeper.pid,
                                                   process_source=process_source))
        assert runtime.agent.procs.__class__.__name__ == {"proc": "ProcSource", "psutil": "PsutilProcSource"}[
            process_source]
        stop = threading.Event()
        result = {}
        thread = threading.Thread(target=lambda: result.setdefault("counters", runtime.run(stop)))
        thread.start()
        wait_for(lambda: (metric_value(collector.metrics(), "clusterwatch_ingest_samples_total") or 0) > 0,
                 what="samples from the runtime")
        stop.set()
        thread.join(30)
        assert not thread.is_alive()
        c = result["counters"]
        # the last poll went out and was acknowledged by the flush
        assert c.samples_sent > 0 and c.samples_acked == c.samples_sent and c.samples_dropped == 0
        assert (tmp_path / "spool" / "agent.pid").read_text().strip().isdigit()
        assert runtime._closed
        runtime.close()  # a second close does nothing
    finally:
        collector.stop()


def test_a_second_live_runtime_for_one_spool_is_refused(tmp_path, sleeper):
    first = AgentRuntime.from_config(_config(tmp_path, "127.0.0.1:9", sleeper.pid))
    try:
        with pytest.raises(SpoolTaken, match="another agent runs for .*spool"):
            AgentRuntime.from_config(_config(tmp_path, "127.0.0.1:9", sleeper.pid))
        # not live (a --once poll, a benchmark): no lock taken, no refusal
        once = AgentRuntime.from_config(_config(tmp_path, None, sleeper.pid), live=False)
        batch, samples = once.one_poll(settle_s=0.05)
        assert [s.pid for s in samples] == [sleeper.pid] and samples[0].job_id == "rt-1"
        once.close()
        with pytest.raises(RuntimeError, match="live=True"):
            once.run(threading.Event())
    finally:
        first.close()


def test_unreadable_tls_file_is_a_config_error_before_anything_opens(tmp_path, sleeper):
    empty = tmp_path / "ca.pem"
    empty.write_text("")
    with pytest.raises(ConfigError, match="--tls-ca .* is empty"):
        AgentRuntime.from_config(_config(tmp_path, "127.0.0.1:9", sleeper.pid, tls_ca=str(empty)))
    assert not (tmp_path / "train.sock").exists()
