#!/usr/bin/env python3
"""Check the NVML GPU source once on a machine with a real NVIDIA GPU.

Run from the repository root with the project installed:

    .venv/bin/python bench/gpu_device_check.py [--polls 8] [--interval 1.0] [--no-workload]

It builds `NvmlGpuSource` on the real `pynvml`, prints the inventory, and polls a few
times while two small CUDA processes run (when torch with CUDA is importable): a busy one
that allocates 128 MiB more every step and multiplies matrices, so memory grows and SMs are
busy, and an idle one that holds 256 MiB and computes nothing. It prints the device and
per-process readings and the cost of a poll in ms, and checks on the hardware what the
stand-in tests assume of the driver (issue 14):

- an idle process NVML lists reads 0 % SM, not unknown (None), once the GPU answered;
- each reading fails alone: a GPU that answers has its memory whatever else is None;
- the utilisation samples' timeStamp is the CPU's wall clock in microseconds, and the
  driver's buffer goes back further than one poll interval (so a first query from 0 would
  take old samples as current): the newest and oldest sample ages are printed.
- GPM (issue 27): which GPUs offer it and what each metric answers over a 1 s window while the
  workload runs (percentages within 0-100; the busy workload's GPU with SM activity above 0);
  a GPU without GPM is printed as such, which is no failure (before Hopper it has none).

Exit status: 0 all steps passed; 1 a step failed unexpectedly (the reason is printed);
2 NVML cannot be used on this machine (the source's one line is printed).
Not imported by the tests; it needs a GPU only to run, not to be byte-compiled.
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time

GiB = 1024**3

# The CUDA workload: exits 3 when torch has no CUDA, prints "ready" once it holds memory.
WORKLOAD = r"""
import sys, time
import torch
if not torch.cuda.is_available():
    sys.exit(3)
dev = torch.device("cuda:0")
a = torch.randn(2048, 2048, device=dev)
blocks = []
print("ready", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    if len(blocks) < 24:
        blocks.append(torch.ones(128 * 2**20, dtype=torch.uint8, device=dev))
    for _ in range(50):
        a = (a @ a).clamp_(-1.0, 1.0)
    torch.cuda.synchronize()
    time.sleep(0.2)
"""


# A process that holds GPU memory and computes nothing: NVML lists it with no utilisation sample.
IDLE_WORKLOAD = r"""
import sys, time
import torch
if not torch.cuda.is_available():
    sys.exit(3)
held = torch.ones(256 * 2**20, dtype=torch.uint8, device=torch.device("cuda:0"))
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(float(sys.argv[1]))
"""


# The seed-style monitor's one subprocess a poll (issue 6 compares the agent with it).
SMI_QUERY = ["nvidia-smi", "--query-gpu=index,uuid,utilization.gpu,memory.used,memory.total,power.draw",
             "--format=csv,noheader,nounits"]


class CheckFailed(Exception):
    """A step did not do what it should."""


def fmt_bytes(value: int | None) -> str:
    return "-" if value is None else f"{value / GiB:.2f} GiB"


def fmt(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:.1f}{unit}"


def start_workload(seconds: float, code: str = WORKLOAD, what: str = "allocating 128 MiB more every step"
                   ) -> subprocess.Popen | None:
    if importlib.util.find_spec("torch") is None:
        print("workload: torch is not importable; polling the idle GPUs only")
        return None
    # stderr to a file, not a pipe: torch warnings must not fill a pipe nobody reads.
    err_file = tempfile.TemporaryFile(mode="w+")
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(seconds)], stdout=subprocess.PIPE, stderr=err_file, text=True
    )
    line = child.stdout.readline().strip() if child.stdout else ""
    if line != "ready":
        code = child.wait(timeout=30)
        if code == 3:
            print("workload: torch has no CUDA here; polling the idle GPUs only")
            return None
        err_file.seek(0)
        err = err_file.read()
        raise CheckFailed(f"the CUDA workload failed (exit {code}): {err.strip()[-500:]}")
    print(f"workload: pid {child.pid} {what} on cuda:0")
    return child


def time_nvidia_smi(calls: int = 5) -> tuple[float, float] | None:
    """Median CPU ms (its own, from RUSAGE_CHILDREN) and wall ms of one `nvidia-smi --query-gpu` call;
    None when there is no nvidia-smi."""
    import resource
    import shutil

    if shutil.which(SMI_QUERY[0]) is None:
        return None
    cpu, wall = [], []
    for _ in range(calls):
        r0, w0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        subprocess.run(SMI_QUERY, capture_output=True, check=True, timeout=60)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall.append((time.perf_counter() - w0) * 1000)
        cpu.append((r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) * 1000)
    return statistics.median(cpu), statistics.median(wall)


def sample_clock(nv, handle) -> None:
    """Print the driver's utilisation samples' ages (issue 14 item 6); raise when the stamps are not µs now."""
    try:
        samples = nv.nvmlDeviceGetProcessUtilization(handle, 0)
    except nv.NVMLError as exc:
        print(f"utilisation samples: none to read ({exc})")
        return
    if not samples:
        print("utilisation samples: none in the driver's buffer")
        return
    now_us = time.time() * 1e6
    ages = [(now_us - int(s.timeStamp)) / 1e6 for s in samples]
    print(f"utilisation samples: {len(samples)} in the buffer, newest {min(ages):.2f} s old, "
          f"oldest {max(ages):.1f} s old")
    if not -5 < min(ages) < 120:
        raise CheckFailed(f"the newest sample is {min(ages):.1f} s from now: timeStamp is not wall-clock µs")


def check_gpm(nv, busy: bool) -> None:
    """GPM on the real driver: two readings 1 s apart through the agent's reader, printed whole."""
    from clusterwatch.agent.backends.nvml_gpm import GpmReader

    reader = GpmReader(nv)
    try:
        reader.read()  # the first sample of each device: the window starts here
        time.sleep(1.0)
        got = reader.read()
    finally:
        reader.close()
    for uuid in reader.without:
        print(f"GPM: {uuid} does not offer it")
    if reader.errors:
        raise CheckFailed(f"GPM: {reader.errors} reads failed")
    percent = ("sm_active", "sm_occupancy", "tensor_active", "dram_active")
    for uuid, a in sorted(got.items()):
        print(f"GPM {uuid} over {a.window_s:.2f} s: " + ", ".join(
            f"{name} {fmt(value, '%' if name in percent else ' B/s')}"
            for name, value in a._asdict().items() if name != "window_s"))
        for name in percent:
            value = getattr(a, name)
            if value is not None and not 0 <= value <= 100:
                raise CheckFailed(f"GPM {uuid}: {name} {value} outside 0..100")
    if busy and got and not any((a.sm_active or 0) > 0 for a in got.values()):
        raise CheckFailed(f"GPM: no GPU shows SM activity while the workload multiplies matrices: {got}")
    if not got and not reader.without:
        raise CheckFailed("GPM: no reading and no GPU said to lack it")


def check(polls: int, interval: float, workload: bool) -> int:
    import pynvml
    from clusterwatch.agent.backends.nvml import NvmlGpuSource

    from clusterwatch.errors import SourceUnavailable

    started = time.perf_counter()
    try:
        src = NvmlGpuSource(pynvml, interval_s=interval, deadline_s=max(0.5, interval / 2))
    except SourceUnavailable as exc:
        print(f"NVML unavailable: {exc}")
        return 2
    print(f"nvmlInit + inventory: {(time.perf_counter() - started) * 1000:.1f} ms")
    child = idle = None
    try:
        inventory = src.inventory()
        if not inventory:
            raise CheckFailed("the source has no GPU in its inventory")
        uuids = {g.uuid for g in inventory}
        if len(uuids) != len(inventory):
            raise CheckFailed("two devices share a UUID")
        for g in inventory:
            print(f"GPU index {g.index}  {g.uuid}  {g.name}  {fmt_bytes(g.memory_total_bytes)}")

        child = start_workload(polls * interval + 5) if workload else None
        idle = (start_workload(polls * interval + 5, IDLE_WORKLOAD, "holding 256 MiB, computing nothing")
                if child is not None else None)
        idle_sm: list[float | None] = []
        wall_ms: list[float] = []
        cpu_ms: list[float] = []
        child_memory: list[int] = []
        seen_pids: set[int] = set()
        errors = 0
        for n in range(polls):
            w0, c0 = time.perf_counter(), time.process_time()
            poll = src.poll(time.time())
            wall_ms.append((time.perf_counter() - w0) * 1000)
            cpu_ms.append((time.process_time() - c0) * 1000)
            errors += poll.errors
            if {r.uuid for r in poll.readings} | set(poll.stale) != uuids:
                raise CheckFailed(f"poll {n}: readings and stale GPUs are not one per inventory GPU")
            if poll.stale:
                raise CheckFailed(f"poll {n}: GPUs {poll.stale} did not answer on a healthy machine")
            print(f"poll {n}: {wall_ms[-1]:.2f} ms wall, {cpu_ms[-1]:.2f} ms CPU, errors {poll.errors}")
            for r in poll.readings:
                if r.memory_used_bytes is not None and r.memory_total_bytes is not None:
                    if not 0 <= r.memory_used_bytes <= r.memory_total_bytes:
                        raise CheckFailed(f"{r.uuid}: memory used {r.memory_used_bytes} outside 0..total")
                if r.memory_used_bytes is None:  # each reading fails alone: memory stands on any GPU
                    raise CheckFailed(f"{r.uuid}: no memory reading (the others: {r})")
                if r.utilization is not None and not 0 <= r.utilization <= 100:
                    raise CheckFailed(f"{r.uuid}: utilisation {r.utilization} outside 0..100")
                print(f"  {r.uuid}  util {fmt(r.utilization, '%')}  mem {fmt_bytes(r.memory_used_bytes)}"
                      f" / {fmt_bytes(r.memory_total_bytes)}  power {fmt(r.power_watts, ' W')}")
            for pid, uses in sorted(poll.processes.items()):
                seen_pids.add(pid)
                for u in uses:
                    mark = ("  <- workload" if child is not None and pid == child.pid else
                            "  <- idle workload" if idle is not None and pid == idle.pid else "")
                    if idle is not None and pid == idle.pid:
                        idle_sm.append(u.sm_utilization)
                    print(f"  pid {pid:>7}  {u.gpu_uuid}  mem {fmt_bytes(u.used_memory_bytes)}"
                          f"  sm {fmt(u.sm_utilization, '%')}{mark}")
                    if child is not None and pid == child.pid and u.used_memory_bytes is not None:
                        child_memory.append(u.used_memory_bytes)
            if n + 1 < polls:
                time.sleep(interval)

        for g in inventory:
            if not g.uuid.startswith("MIG-"):
                sample_clock(pynvml, pynvml.nvmlDeviceGetHandleByUUID(g.uuid))
                break
        check_gpm(pynvml, busy=child is not None and child.poll() is None)
        print(f"cost per poll: median {statistics.median(wall_ms):.2f} ms wall "
              f"(max {max(wall_ms):.2f}), median {statistics.median(cpu_ms):.2f} ms CPU")
        smi = time_nvidia_smi()
        if smi is None:
            print("nvidia-smi: not found; the seed's cost is not measured here")
        else:
            print(f"nvidia-smi --query-gpu (the seed's subprocess a poll): median {smi[0]:.2f} ms CPU, "
                  f"{smi[1]:.1f} ms wall; NVML poll {statistics.median(cpu_ms):.2f} ms CPU")
        if errors:
            raise CheckFailed(f"{errors} NVML reads failed on a healthy machine")
        if max(wall_ms) > 1000:
            raise CheckFailed(f"a poll took {max(wall_ms):.0f} ms")
        if idle is not None and idle_sm:
            # issue 14 item 1: NVML keeps no sample for a process that computes nothing; it must read 0 %
            if idle_sm[-1] != 0.0:
                raise CheckFailed(f"the idle workload's SM utilisation reads {idle_sm} (wanted 0.0 at the end)")
            print(f"idle workload SM utilisation: {idle_sm} (0 % once listed: gpu_stall can fire)")
        if child is not None:
            if child.poll() is not None:
                raise CheckFailed(f"the CUDA workload exited early (status {child.returncode})")
            if not child_memory:
                # NVML reports host pids; in a container without the host pid namespace the
                # workload's pid does not match, and some containers list no process at all.
                print(f"WARN: the workload's pid {child.pid} is not among NVML's pids {sorted(seen_pids)}: "
                      "run in the host pid namespace to check per-process readings")
            elif len(child_memory) > 2 and child_memory[-1] <= child_memory[0]:
                raise CheckFailed(f"the workload's GPU memory did not grow: {child_memory}")
            else:
                print(f"workload memory seen: {fmt_bytes(child_memory[0])} -> {fmt_bytes(child_memory[-1])}")
        print("OK")
        return 0
    except CheckFailed as exc:
        print(f"FAILED: {exc}")
        return 1
    finally:
        for proc in (child, idle):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        src.close()


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and run the check.

    Args:
        argv: command-line arguments (default: sys.argv[1:]).

    Returns:
        The exit status: 0 passed, 1 failed, 2 NVML unavailable.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=8, help="number of polls (default 8)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between polls (default 1)")
    parser.add_argument("--no-workload", action="store_true", help="do not start the CUDA workload")
    args = parser.parse_args(argv)
    return check(max(1, args.polls), args.interval, not args.no_workload)


if __name__ == "__main__":
    sys.exit(main())
