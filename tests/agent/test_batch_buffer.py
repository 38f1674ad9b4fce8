"""agent/stream.py BatchBuffer: bounded, oldest dropped first and counted."""
from __future__ import annotations

from clusterwatch.agent.stream import BatchBuffer
from clusterwatch.v1 import agent_pb2


def test_batch_buffer_drops_oldest_first_and_counts():
    buf = BatchBuffer(max_samples=100)
    for seq in range(1, 6):
        dropped = buf.add(seq, agent_pb2.Batch(seq=seq), 30)
        assert dropped == (30 if seq >= 4 else 0)
    assert [s for s, _ in buf.after(0)] == [3, 4, 5]
    assert buf.ack(4) == 30 and buf.ack(4) == 0
    assert [s for s, _ in buf.after(3)] == [5]
