#!/usr/bin/env python3
"""What GPU health costs the agent: through the real pynvml and the C stand-in, 8 GPUs.

    .venv/bin/python bench/bench_health.py [--reads 50]

Rows (CPU time of this process, time.process_time, per call):

- counters: one CounterReader.read() of 8 GPUs (ECC, remapped rows, retired pages, clock event
  reasons, violation time per policy, temperature, PCIe replays, NVLink errors on 18 links), the
  call the health thread makes every 30 s by default;
- drain: HealthMonitor.drain_into(batch) with 8 counter records and 4 events held, the part the
  poll itself pays (the readers run on their own threads);
- kmsg: parsing one /dev/kmsg record holding an XID line (KmsgReader.feed).

The poll's own cost is bench/bench_agent.py's; these rows are what health adds beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def state(gpus: int = 8) -> str:
    lines = []
    for i in range(gpus):
        uuid = f"GPU-bench{i:02d}"
        lines.append(f"gpu {uuid} util=90 temp=70 throttle=0x1 pci=0000:{0x18 + i:02x}:00 name=NVIDIA H100 80GB HBM3")
        lines.append(f"ecc {uuid} corrected_volatile=3 corrected_aggregate=10")
        lines.append(f"remapped {uuid} corrected=1")
        lines.append(f"health {uuid} viol_power_ns=1000 replay=2 nvlinks=18 nvlink_replay=1")
    return "\n".join(lines) + "\n"


def child(reads: int) -> None:
    import pynvml
    from clusterwatch.agent.health.counters import CounterReader
    from clusterwatch.agent.health.kmsg import KmsgReader
    from clusterwatch.agent.health.monitor import HealthMonitor
    from clusterwatch.v1 import agent_pb2

    reader = CounterReader(pynvml)
    reader.read()   # the first read learns what each GPU lacks
    t0 = time.process_time()
    for _ in range(reads):
        got = reader.read()
    counters_s = (time.process_time() - t0) / reads
    reader.close()

    monitor = HealthMonitor(None, None)
    t_drain = 0.0
    for _ in range(reads * 20):
        for c in got:
            monitor._counters.append(c)
        for i in range(4):
            monitor._hold(lambda out, i=i: out.MergeFrom(agent_pb2.HealthEvent(uuid="GPU-bench00", kind="xid",
                                                                               xid=13 + i)))
        batch = agent_pb2.Batch()
        t0 = time.process_time()
        monitor.drain_into(batch)
        t_drain += time.process_time() - t0
    drain_s = t_drain / (reads * 20)

    with tempfile.NamedTemporaryFile() as f:
        kmsg = KmsgReader(f.name, lambda e: None, resolve_pci={"0000:3b:00": "GPU-a"}.get, boot_time=0.0)
        line = "3,7,2500000,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=1234, name=python, Graphics SM Warp Exception"
        n = reads * 200
        t0 = time.process_time()
        for _ in range(n):
            kmsg.feed(line)
        kmsg_s = (time.process_time() - t0) / n
        kmsg.stop()
    print(json.dumps({"counters_ms": counters_s * 1e3, "drain_us": drain_s * 1e6, "kmsg_us": kmsg_s * 1e6,
                      "gpus": len(got)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=50)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.reads)
        return
    from tests.fakes.nvml_stub import build, child_env, write_state

    with tempfile.TemporaryDirectory() as tmp:
        lib = build(Path(tmp) / "lib")
        state_file = Path(tmp) / "state.txt"
        write_state(state_file, state())
        proc = subprocess.run([sys.executable, __file__, "--child", "--reads", str(args.reads)],
                              env=child_env(lib, state_file), capture_output=True, text=True, check=True)
    got = json.loads(proc.stdout)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"GPU health cost, {time.strftime('%Y-%m-%d')}, commit {commit}, {os.cpu_count()} CPUs, "
          f"{got['gpus']} GPUs through the real pynvml and the C stand-in")
    print(f"  counters, one read of every GPU (every 30 s): {got['counters_ms']:8.2f} ms CPU")
    print(f"  drain into a batch (each poll):               {got['drain_us']:8.1f} µs CPU")
    print(f"  one kernel-log record parsed:                 {got['kmsg_us']:8.1f} µs CPU")


if __name__ == "__main__":
    main()
