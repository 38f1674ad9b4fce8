"""One rank of the demo's small training-like workload (run by `clusterwatch demo`).

Each rank does a little CPU work per step and reports its step and loss through
clusterwatch.train. With --leak it also keeps growing its host memory, and, through
the simulated GPU source's memory file, its simulated GPU memory: the behaviour the
demo's leak alerts should catch.
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time

MIB = 1024 * 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--leak-mib-per-s", type=float, default=0.0, help="host memory growth per second")
    ap.add_argument("--gpu-leak-mib-per-s", type=float, default=0.0, help="simulated GPU memory growth per second")
    ap.add_argument("--gpu-base-mib", type=float, default=20480.0)
    ap.add_argument("--step-s", type=float, default=0.2)
    args = ap.parse_args()

    try:
        from clusterwatch import train
    except ImportError:  # the demo still runs without progress reports
        train = None
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    mem_file = os.environ.get("CLUSTERWATCH_SIM_GPU_MEM_FILE")
    hoard: list[bytearray] = []
    started = time.time()
    step = 0
    while not stop:
        t0 = time.time()
        acc = 0.0
        for i in range(20_000):  # a little real CPU work per step
            acc += math.sin(i * 0.001)
        step += 1
        elapsed = time.time() - started
        if args.leak_mib_per_s > 0:
            want = int(args.leak_mib_per_s * elapsed)
            while len(hoard) < want:
                block = bytearray(MIB)
                block[::4096] = b"x" * len(block[::4096])  # touch every page so it counts in RSS
                hoard.append(block)
        if mem_file:
            gpu_bytes = int((args.gpu_base_mib + args.gpu_leak_mib_per_s * elapsed) * MIB)
            tmp = f"{mem_file}.tmp"
            with open(tmp, "w") as f:
                f.write(str(gpu_bytes))
            os.replace(tmp, mem_file)
        if train is not None:
            train.report(step=step, loss=2.5 * math.exp(-step / 300) + 0.1, lr=3e-4)
        time.sleep(max(0.0, args.step_s - (time.time() - t0)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
