#!/usr/bin/env python3
"""Wall time of `clusterwatch status JOBID` (Python start-up included) and of `clusterwatch prolog`.

    .venv/bin/python bench/bench_cli.py [--quick] [--repeat 9]

`status`: a real collector on loopback holds a job of 8 nodes × 8 ranks (each rank with 7
DataLoader workers: 512 processes, 64 GPUs), fed through the real gRPC ingest path; the
console script `clusterwatch status JOBID` runs as a new process each time, beside
`python -c pass` and `python -c "import grpc"` (same interpreter) as baselines, interleaved.

`prolog`: `clusterwatch prolog` with SLURM_* set as slurmd sets them, a temporary spool
folder and the collector down (its address is a closed loopback port). Two cases: the agent
already runs (the usual case: the hook finds it), and the first prolog on a node, which
starts the agent detached (the agent it starts is stopped by its pid, from the pid file).
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchlib  # noqa: E402
from benchlib import PYTHON, Children, CollectorProc, median, spread, table, verdict  # noqa: E402
from waiting import wait_for  # noqa: E402

STATUS_TARGET_MS = 300
PROLOG_TARGET_MS = 200


def console_script() -> list[str]:
    """The installed `clusterwatch` entry point beside this interpreter, else `python -m`."""
    exe = os.path.join(os.path.dirname(PYTHON), "clusterwatch")
    if os.path.exists(exe):
        return [exe]
    found = shutil.which("clusterwatch")
    return [found] if found else list(benchlib.CLI)


def compile_bytecode() -> None:
    """Byte-compile clusterwatch's own modules, as pip does when it installs the wheel.

    grpc, click and protobuf come from wheels and load from bytecode; an editable install leaves
    ours to the first run, and where PYTHONDONTWRITEBYTECODE is set (it was in the shells that
    measured this) nothing is written, so every run would compile clusterwatch/report/ and the rest again
    (15-30 ms here).
    """
    import compileall
    import importlib.util

    for package in ("clusterwatch", "clusterwatch.cli", "clusterwatch.v1"):
        for folder in importlib.util.find_spec(package).submodule_search_locations:
            compileall.compile_dir(folder, maxlevels=0, quiet=1)


def wall_ms(argv: list[str], env: dict | None = None, check: bool = True) -> float:
    t0 = time.perf_counter()
    out = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, timeout=60)
    ms = (time.perf_counter() - t0) * 1000
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {out.returncode}: {out.stderr.decode(errors='replace')[-500:]}")
    return ms


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def prolog_env(spool: str, job_id: str, node: str) -> dict:
    env = benchlib.env_with_repo()
    env.update({
        "SLURM_JOB_ID": job_id, "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_USER": "bench",
        "SLURMD_NODENAME": node, "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7",
        "CLUSTERWATCH_COLLECTOR": f"127.0.0.1:{closed_port()}", "CLUSTERWATCH_SPOOL": spool,
        "CLUSTERWATCH_GPU_SOURCE": "none",
    })
    return env


def stop_started_agent(spool: str) -> None:
    """Stop the agent a prolog started, by the pid in its pid file (only if it is a clusterwatch agent)."""
    from clusterwatch.agent.ensure import PID_FILE, agent_alive, read_pid

    pid = read_pid(os.path.join(spool, PID_FILE))
    if pid is None or not agent_alive(pid, spool):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
        with open(f"/proc/{pid}/stat", "rb") as f:
            if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                break
        time.sleep(0.05)
    else:
        if os.path.exists(f"/proc/{pid}"):
            os.kill(pid, signal.SIGKILL)


def measure_prolog(cw: list[str], tmp: str, repeat: int) -> dict | None:
    import importlib.util

    if importlib.util.find_spec("clusterwatch.cli.hooks_cmd") is None:
        return None
    first, again, gated = [], [], []
    for i in range(repeat):
        spool = os.path.join(tmp, f"spool{i}")
        env = prolog_env(spool, str(5000 + i), f"bench-prolog-{i}")
        try:
            first.append(wall_ms([*cw, "prolog"], env))  # no agent yet: it starts one, detached
            wait_for(lambda s=spool: os.path.exists(os.path.join(s, "agent.pid")), 10, interval=0.05,
                     what="agent pid file")
            env["SLURM_JOB_ID"] = str(6000 + i)
            again.append(wall_ms([*cw, "prolog"], env))  # the agent runs: the hook only finds it
            write_healthy_file(spool)
            env.update(SLURM_JOB_ID=str(7000 + i), CLUSTERWATCH_GATE="1")
            gated.append(wall_ms([*cw, "prolog"], env))  # --gate: it reads the health file too
        finally:
            stop_started_agent(spool)
    return {"first": first, "again": again, "gated": gated}


def write_healthy_file(spool: str) -> None:
    """The health file as the node's agent writes it (GPU source none here: it writes none), healthy and fresh."""
    from clusterwatch.agent.ensure import PID_FILE, read_pid

    from clusterwatch.slurm.health_gate import FILE_NAME, HealthFile

    doc = HealthFile(written_at=time.time(), valid_for_s=60.0, agent_pid=read_pid(os.path.join(spool, PID_FILE)) or 0,
                     counters_read_at=time.time())
    path = os.path.join(spool, FILE_NAME)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(doc.to_json())


def run(quick: bool = False, repeat: int = 9, show: bool = True) -> dict:
    if quick:
        repeat = 2
    cw = console_script()
    compile_bytecode()
    job = "8888"
    base = {"pass": [], "grpc": [], "status": [], "json": []}
    with benchlib.tmpdir("cw-bench-cli-") as tmp, Children() as children:
        collector = CollectorProc(children, tmp, name="cli-collector")
        acked = benchlib.feed_job(collector.address, job, nodes=8, ranks=8, batches=3)
        env = benchlib.env_with_repo()
        env["CLUSTERWATCH_COLLECTOR"] = collector.address
        check = subprocess.run([*cw, "status", job], capture_output=True, text=True, env=env, timeout=60)
        if check.returncode != 0:
            raise RuntimeError(f"clusterwatch status failed: {check.stderr[-1000:]}")
        status_lines = len(check.stdout.splitlines())
        wall_ms([*cw, "status", job], env)  # warm the page cache
        for _ in range(repeat):
            base["pass"].append(wall_ms([PYTHON, "-c", "pass"]))
            base["grpc"].append(wall_ms([PYTHON, "-c", "import grpc"]))
            base["status"].append(wall_ms([*cw, "status", job], env))
            base["json"].append(wall_ms([*cw, "status", job, "--json"], env))
        collector.stop()
        prolog = measure_prolog(cw, tmp, max(2, repeat // 2))
    st = median(base["status"])
    rows = [
        ["python -c pass", median(base["pass"]), spread(base["pass"]), "baseline"],
        ['python -c "import grpc"', median(base["grpc"]), spread(base["grpc"]), "baseline"],
        [f"clusterwatch status {job}", st, spread(base["status"]),
         f"≤ {STATUS_TARGET_MS} ms: {verdict(st <= STATUS_TARGET_MS)}"],
        [f"clusterwatch status {job} --json", median(base["json"]), spread(base["json"]), "-"],
    ]
    if prolog is None:
        rows.append(["clusterwatch prolog", "-", "-", "NOT THERE YET (cli/hooks_cmd.py missing)"])
        pr = None
    else:
        pr = median(prolog["again"])
        rows.append(["clusterwatch prolog, agent running, collector down", pr, spread(prolog["again"]),
                     f"≤ {PROLOG_TARGET_MS} ms: {verdict(pr <= PROLOG_TARGET_MS)}"])
        pg = median(prolog["gated"])
        rows.append(["clusterwatch prolog --gate, agent running, healthy", pg, spread(prolog["gated"]),
                     f"≤ {PROLOG_TARGET_MS} ms: {verdict(pg <= PROLOG_TARGET_MS)}"])
        pf = median(prolog["first"])
        rows.append(["clusterwatch prolog, first on the node (starts the agent)", pf, spread(prolog["first"]),
                     f"≤ {PROLOG_TARGET_MS} ms: {verdict(pf <= PROLOG_TARGET_MS)}"])
    notes = [
        f"job {job}: 8 nodes × 8 ranks × (1 + 7 workers) = 512 processes, {acked:,} samples fed over gRPC; "
        f"`status` prints {status_lines} lines.",
        f"wall time of a new process each run ({' '.join(os.path.basename(c) for c in cw)}), median of {repeat} "
        "interleaved runs; 'runs' = min–max; clusterwatch's modules byte-compiled first, as a wheel install does.",
    ]
    out = table("CLI wall time, Python start-up included", ["command", "ms", "runs", "target"], rows, notes)
    if show:
        print(out, flush=True)
    return {"status_ms": st, "prolog_ms": pr, "table": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few seconds: 2 runs each")
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    run(args.quick, args.repeat)


if __name__ == "__main__":
    main()
