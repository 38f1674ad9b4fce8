"""The sender at the agent's stop: a flush ends a reconnect backoff, and what never got through is counted."""
from __future__ import annotations

from clusterwatch.agent.stream import Sender
from clusterwatch.v1 import agent_pb2

from tests.services.procs import free_port
from tests.support.helpers import AGENT_TOKEN, Collector, wait_for


def _hello() -> agent_pb2.Hello:
    return agent_pb2.Hello(node="stop-node")


def test_a_flush_reconnects_at_once_instead_of_waiting_out_the_backoff(tmp_path):
    # The collector comes back while the stream sleeps a long backoff (at most 30 s in the field):
    # the epilog's SIGTERM flushes for 5 s and must not spend them asleep.
    # a Unix socket, not a port found free now: another test's process could take a port before the collector
    address = f"unix:{tmp_path}/collector.sock"
    sender = Sender(address, _hello, max_buffer_samples=100, backoff_initial_s=25.0, token=AGENT_TOKEN)
    sender.start()
    collector = None
    try:
        sender.submit(agent_pb2.Batch(), 0)
        wait_for(lambda: sender.last_error, what="the first connection to fail")
        collector = Collector(tmp_path, listen=address)
        assert sender.flush(8.0), f"still {len(sender.buffer)} batches unacknowledged: {sender.last_error}"
    finally:
        sender.stop(2.0)
        if collector is not None:
            collector.stop()
    assert sender.counters.samples_unsent == 0


def test_samples_unacknowledged_at_stop_are_counted_unsent():
    sender = Sender(f"127.0.0.1:{free_port()}", _hello, max_buffer_samples=100, backoff_initial_s=25.0)
    sender.start()
    sender.submit(agent_pb2.Batch(), 5)
    sender.submit(agent_pb2.Batch(), 7)
    assert not sender.flush(0.5)
    sender.stop(2.0)
    c = sender.counters
    assert (c.samples_sent, c.samples_acked, c.samples_dropped, c.samples_unsent) == (12, 0, 0, 12)
