#!/usr/bin/env python3
"""clusterwatch.train.report(): its cost with and without the allocator's figures.

    .venv/bin/python bench/bench_train.py [--reports 20000] [--runs 5]

Each case sends `--reports` reports from this process to a bound datagram socket drained by a
thread (the agent's part), and prints the median cost of one report() over `--runs` runs:

- plain: step, loss, lr, no torch in sys.modules (what every report costs today);
- torch, every 5 s: a torch-shaped module with CUDA initialised and 1 or 8 used devices, read at
  the shipped interval (train.ALLOCATOR_EVERY_S): the cost a training loop sees;
- torch, every report: the interval set to 0, so each report reads the allocator: the cost of one
  read, paid once every 5 s;
- passed figures: report(..., gpu_allocated_bytes=, gpu_reserved_bytes=) every time.

torch is not installed on the benchmark machines: the stand-in's memory_stats returns a copy of a
dict with the 80 keys of a real torch 2.x memory_stats(), so the figures are clusterwatch's side;
a real torch's memory_stats (a C++ call and a flattening in Python) adds its own cost to the read.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import threading
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib import median, spread, table  # noqa: E402

from clusterwatch import train  # noqa: E402

_STAT_NAMES = [f"{kind}.{pool}.{what}" for kind in ("allocated_bytes", "reserved_bytes", "active_bytes",
                                                    "inactive_split_bytes", "allocation", "segment",
                                                    "active", "inactive_split", "requested_bytes")
               for pool in ("all", "large_pool", "small_pool") for what in ("current", "peak", "allocated")]


def stand_in_torch(devices: int) -> types.ModuleType:
    stats = {name: 1 << 30 for name in _STAT_NAMES[:78]}
    stats.update({"num_alloc_retries": 3, "num_ooms": 0})
    cuda = types.ModuleType("torch.cuda")
    cuda.is_initialized = lambda: True
    cuda.current_device = lambda: 0
    cuda.device_count = lambda: devices
    cuda.memory_stats = lambda i: dict(stats)
    cuda.get_device_properties = lambda i: types.SimpleNamespace(uuid=f"5a1d2c3e-0000-4000-8000-{i:012d}")
    torch = types.ModuleType("torch")
    torch.cuda = cuda
    return torch


def drain(sock: socket.socket, stop: threading.Event) -> None:
    sock.settimeout(0.2)
    while not stop.is_set():
        try:
            sock.recv(65536)
        except OSError:
            pass


def one_run(n: int, torch: types.ModuleType | None, every_s: float, passed: bool) -> float:
    train._state = train._State()
    train.ALLOCATOR_EVERY_S = every_s
    if torch is None:
        sys.modules.pop("torch", None)
    else:
        sys.modules["torch"] = torch
    report = train.report
    t0 = time.perf_counter()
    if passed:
        for i in range(n):
            report(step=i, loss=0.5, lr=3e-4, gpu_allocated_bytes=1 << 30, gpu_reserved_bytes=2 << 30)
    else:
        for i in range(n):
            report(step=i, loss=0.5, lr=3e-4)
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reports", type=int, default=20000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    shipped = train.ALLOCATOR_EVERY_S
    with tempfile.TemporaryDirectory(prefix="cw-bench-train-") as d:
        path = os.path.join(d, "train.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        stop = threading.Event()
        reader = threading.Thread(target=drain, args=(sock, stop), daemon=True)
        reader.start()
        os.environ[train.SOCKET_ENV] = path
        cases = [("plain (no torch)", None, shipped, False),
                 ("torch, 1 device, every 5 s", stand_in_torch(1), shipped, False),
                 ("torch, 8 devices, every 5 s", stand_in_torch(8), shipped, False),
                 ("torch, 1 device, every report", stand_in_torch(1), 0.0, False),
                 ("torch, 8 devices, every report", stand_in_torch(8), 0.0, False),
                 ("passed figures, every report", None, shipped, True)]
        rows = []
        for name, torch, every_s, passed in cases:
            costs = [one_run(args.reports, torch, every_s, passed) * 1e6 for _ in range(args.runs)]
            rows.append([name, median(costs), spread(costs), train.sent(), train.dropped()])
        stop.set()
        reader.join()
        sock.close()
    sys.modules.pop("torch", None)
    print(table(f"clusterwatch.train.report(): µs per call, {args.reports} reports x {args.runs} runs",
                ["case", "median µs", "runs", "sent (last run)", "dropped (last run)"], rows,
                notes=["torch is a stand-in (see the module docstring): a real memory_stats adds its own cost "
                       "to each read, once every 5 s",
                       "dropped: the kernel queue was full when the reader thread fell behind (never blocks)"]))


if __name__ == "__main__":
    main()
