#!/usr/bin/env python3
"""What the health engine's per-GPU history for `record` costs the collector (collector/health/engine.py).

    .venv/bin/python bench/bench_health_history.py [--gpus 8000] [--quick]

Rows:

- memory: bytes the history of a GPU holds when full (HISTORY_READINGS counter readings as the agent sends
  them, every counter an H100 gives), measured with tracemalloc over `--gpus` GPUs (8,000: the thousand
  nodes of eight a collector holds): counters standing still, and the worst case, a temperature that
  differs at every reading; a GPU at its power cap (its violation time moves at every reading) beside the same
  readings without any violation time; and HISTORY_EVENTS XIDs from the kernel log on a GPU (most GPUs have none);
- observe: CPU per HealthEngine.observe_counters call with the history, beside the same engine with the two
  appends taken out (the baseline in the same run);
- trace: CPU to write the health records of one job's 8 GPUs with full histories (collector/traces/record.py).
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def reading(t: float, uuid: str, temperature: int = 70):
    from clusterwatch.v1 import agent_pb2

    m = agent_pb2.GpuHealth(time=t, uuid=uuid, ecc_corrected_volatile=3, ecc_uncorrected_volatile=0,
                            ecc_corrected_aggregate=10, ecc_uncorrected_aggregate=0, remapped_rows_corrected=1,
                            remapped_rows_uncorrected=0, remapped_rows_pending=False, remapped_rows_failure=False,
                            clock_event_reasons=0x1, temperature_c=temperature, pcie_replays=2)
    m.violation_seconds.update({"power": 1.0, "thermal": 0.0})
    m.nvlink_errors.update({"replay": 1, "recovery": 0, "crc_flit": 0, "crc_data": 0})
    return m


def event(t: float, uuid: str, seq: int):
    from clusterwatch.v1 import agent_pb2

    return agent_pb2.HealthEvent(time=t, uuid=uuid, kind="xid", xid=13, pid=4242, process="python", source=2,
                                 pci="0000:3b:00", kernel_boot_id="6a1e4c1e-0b8a-4e55-9d2f-2f1b7c3f3d10",
                                 kmsg_seq=seq, text="Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=8000)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    gpus = 200 if args.quick else args.gpus
    from clusterwatch.collector.health.decisions import GpuUser
    from clusterwatch.collector.health.engine import HISTORY_EVENTS, HISTORY_READINGS, HealthEngine
    from clusterwatch.collector.health.xid_catalog import load_catalog

    catalog = load_catalog()
    t0 = 1_800_000_000.0
    still = [reading(t0 + 30 * i, "GPU-bench") for i in range(HISTORY_READINGS)]
    moving = [reading(t0 + 30 * i, "GPU-bench", 40 + i % 50) for i in range(HISTORY_READINGS)]
    # a GPU at its power cap all along (common under training): its power violation time moves at every reading,
    # beside the same readings without the violation time (what the history held before it was kept)
    capped = [reading(t0 + 30 * i, "GPU-bench") for i in range(HISTORY_READINGS)]
    for i, m in enumerate(capped):
        m.violation_seconds["power"] = 1.0 + 15.0 * i
    uncounted = [reading(t0 + 30 * i, "GPU-bench") for i in range(HISTORY_READINGS)]
    for m in uncounted:
        m.ClearField("violation_seconds")
    evs = [event(t0 + 30 * i, "GPU-bench", i) for i in range(HISTORY_EVENTS)]

    def per_gpu(msgs: list, events: list, distinct: bool = False) -> float:
        """Bytes a GPU's full history holds (views made before the count: they are there without history)."""
        eng = HealthEngine(catalog, same_xid_s=0.0)
        views = [eng.view(f"n{g // 8}", f"GPU-{g:05d}") for g in range(gpus)]
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for v in views:
            for m in msgs:
                v.keep_reading(m)
            for e in events:  # with the user it names (the engine keeps whom each event named), each a new
                # process (a new tuple) where `distinct`, else the one process again (a tuple shared, as the engine's)
                named = (GpuUser("7", 0, e.pid, e.process, e.time if distinct else t0),)
                if v.events and v.events[-1][2] == named:
                    named = v.events[-1][2]
                v.events.append((e.time, e.SerializeToString(), named))
        got = (tracemalloc.get_traced_memory()[0] - before) / gpus
        tracemalloc.stop()
        return got

    history_still = per_gpu(still, [])
    history_moving = per_gpu(moving, [])
    history_capped = per_gpu(capped, [])
    history_uncounted = per_gpu(uncounted, [])
    history_events = per_gpu([], evs)
    history_events_distinct = per_gpu([], evs, distinct=True)

    # CPU of observe_counters, with and without the history's appends
    n = 2000 if args.quick else 20000
    feed = [reading(t0 + 30 * i, f"GPU-{i % 8}") for i in range(n)]

    def run(engine: HealthEngine) -> float:
        start = time.process_time()
        for m in feed:
            engine.observe_counters("n1", m, ())
        return (time.process_time() - start) / n

    with_history = run(HealthEngine(catalog))
    bare = HealthEngine(catalog)

    class _NoDeque(list):
        def append(self, x) -> None:
            pass

    for i in range(8):
        bare.view("n1", f"GPU-{i}").readings = _NoDeque()   # type: ignore[assignment]
    without = run(bare)

    # writing one job's health records: 8 GPUs, full histories
    from clusterwatch.collector.traces.record import gpu_health_record, health_event_record
    from clusterwatch.v1 import agent_pb2

    start = time.process_time()
    reps = 3 if args.quick else 20
    for _ in range(reps):
        for _g in range(8):
            for _, data in [(m.time, m.SerializeToString()) for m in moving]:
                gpu_health_record("n1", agent_pb2.GpuHealth.FromString(data))
            for e in evs:
                health_event_record("n1", agent_pb2.HealthEvent.FromString(e.SerializeToString()), e.time)
    trace_s = (time.process_time() - start) / reps

    print(f"health history for record: {HISTORY_READINGS} readings + {HISTORY_EVENTS} events per GPU, {gpus} GPUs")
    print(f"{'row':<40}{'figure':>16}")
    for name, b in (("readings, counters still", history_still), ("readings, temperature moving", history_moving),
                    ("readings, power time moving", history_capped),
                    ("readings, no violation time (baseline)", history_uncounted),
                    ("events, full", history_events), ("events, full, each a new process", history_events_distinct)):
        print(f"{name + ', per GPU':<40}{b / 1024:>13.1f} KiB")
        print(f"{'  for 8,000 GPUs':<40}{b * 8000 / 2**20:>13.1f} MiB")
    print(f"{'observe_counters, with history':<40}{with_history * 1e6:>13.1f} µs")
    print(f"{'observe_counters, no history':<40}{without * 1e6:>13.1f} µs")
    print(f"{'one job of 8 GPUs: health records':<40}{trace_s * 1e3:>13.1f} ms")


if __name__ == "__main__":
    main()
