"""The memory a process's history point takes in a real CollectorCore fed numbered batches (issue 19): 254
bytes as a deque of named tuples (bench/bench_history_memory.py), 56 as columns in a ring."""
from __future__ import annotations

import tracemalloc

from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.state.core import CollectorCore
from clusterwatch.collector.state.store import Store, open_db
from clusterwatch.v1 import agent_pb2

from clusterwatch.model import GpuUse, ProcessSample
from clusterwatch.wire import processes_to_table

T0 = 1_800_000_000.0


def _send(core: CollectorCore, seq: int, t: float, processes: int) -> None:
    procs = [ProcessSample(t, "n1", 1000 + p, T0 - 100, user="alice", job_id="7", rank=p, cpu_percent=99.5 + p,
                           rss_bytes=(3 << 30) + p * 4096 + seq, threads=40 + p, open_fds=300 + p,
                           gpus=(GpuUse(f"GPU-{p % 8}", (20 << 30) + seq, 97.0),)) for p in range(processes)]
    b = agent_pb2.Batch(seq=seq)
    processes_to_table(procs, b.processes)
    assert core.batch("n1", "b1", b) is True


def test_a_process_history_point_takes_under_64_bytes() -> None:
    """64 processes, their history filled: as deques of named tuples 254 B a point (bench_history_memory.py)."""
    processes, points = 64, 200
    core = CollectorCore(CollectorConfig(), Store(open_db(":memory:")), clock=lambda: T0)
    core.state.history_points, core.state.history_step_s = points, 1.0
    core.hello(agent_pb2.Hello(node="n1", boot_id="b1", interval_s=1.0, send_interval_s=1.0))
    _send(core, 1, T0, processes)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for k in range(1, points):
            _send(core, k + 1, T0 + k, processes)
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    held = [s for s in core.state.processes.values()]
    assert len(held) == processes and all(len(s.history) == points for s in held)
    per_point = grown / (processes * (points - 1))
    assert per_point < 64, f"{per_point:.0f} bytes a history point"
