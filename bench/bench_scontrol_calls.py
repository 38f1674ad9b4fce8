#!/usr/bin/env python3
"""Slurm calls of the job registry: one collector against the same jobs as N shards of one deployment.

    .venv/bin/python bench/bench_scontrol_calls.py [--shards 3] [--jobs 8] [--duration 60] [--refresh 5]

A real two-node Slurm on loopback (tests/services/slurm.py: munged, slurmctld, two slurmd) runs `--jobs`
jobs that sleep. Each collector (`clusterwatch collector --slurm`) gets its own folder first on PATH with
an `scontrol` and a `squeue` that append the call to that collector's log and exec the real binary, so
every Slurm client call a collector makes is counted, by kind. First one collector for `--duration`
seconds, then `--shards` shards of one deployment (`--collectors` list, `--shard` each) for as long.

Printed: calls a minute by kind for the one collector, each shard and the shards in all, side by side,
and the job records Slurm printed a minute (each listing prints every job; slurmctld's cost grows with
both). The start's probes (`--help`, once a process) are counted apart.
"""
from __future__ import annotations

import argparse
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib import Children, CollectorProc, table  # noqa: E402

from tests.services.procs import free_port  # noqa: E402
from tests.services.slurm import running_slurm_cluster  # noqa: E402

#: What a call is, from its arguments (the registry's calls, collector/jobmap/scontrol.py).
KINDS = ("listing", "one job", "owners", "listpids", "other")

_WRAPPER = """#!/bin/sh
# counts each call of this collector's, then runs the real client
printf '%s %s\\n' "$(date +%s.%N)" "{name} $*" >> "{log}"
exec {real} "$@"
"""


def kind(line: str) -> str | None:
    """The kind of a logged call; None for a start-up probe (--help)."""
    name, _, args = line.partition(" ")
    words = args.split()
    if words == ["--help"]:
        return None
    if name == "squeue":
        return "owners" if "-j" in words else "listing"  # squeue --json, or the text path's owners list
    if "listpids" in words:
        return "listpids"
    if "show" in words and "job" in words:
        return "one job" if words[-1].isdigit() else "listing"
    return "other"


def wrappers(folder: Path, log: Path) -> Path:
    folder.mkdir(parents=True)
    for name in ("scontrol", "squeue"):
        real = shutil.which(name)
        if real is None:
            raise SystemExit(f"{name} not found: install slurm-client")
        path = folder / name
        path.write_text(_WRAPPER.format(name=name, log=log, real=real))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return folder


def start_collector(children: Children, tmp: Path, name: str, slurm_env: dict, refresh: float,
                    *extra: str) -> tuple[CollectorProc, Path]:
    log = tmp / f"{name}-calls.log"
    log.touch()
    folder = wrappers(tmp / f"{name}-bin", log)
    saved = dict(os.environ)
    os.environ.update(SLURM_CONF=slurm_env["SLURM_CONF"], PATH=f"{folder}:{slurm_env.get('PATH', os.defpath)}")
    try:
        proc = CollectorProc(children, str(tmp), "--slurm", "--slurm-refresh", f"{refresh:g}", *extra, name=name)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return proc, log


def count(log: Path, since: float, until: float) -> tuple[dict[str, int], int]:
    """Calls by kind logged in [since, until), and the start's probes."""
    counts = dict.fromkeys(KINDS, 0)
    probes = 0
    for line in log.read_text().splitlines():
        stamp, _, call = line.partition(" ")
        k = kind(call)
        if k is None:
            probes += 1
        elif since <= float(stamp) < until:
            counts[k] += 1
    return counts, probes


def run_phase(children: Children, tmp: Path, slurm_env: dict, names: list[str], extras: list[list[str]],
              duration: float, refresh: float) -> tuple[list[tuple[dict[str, int], int]], float]:
    started = [start_collector(children, tmp, n, slurm_env, refresh, *e) for n, e in zip(names, extras, strict=True)]
    since = time.time()
    time.sleep(duration)
    until = time.time()
    out = [count(log, since, until) for _, log in started]
    for proc, _ in started:
        proc.stop()
    return out, until - since


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=8, help="jobs running in Slurm (each one task that sleeps)")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds a phase")
    ap.add_argument("--refresh", type=float, default=5.0, help="--slurm-refresh of every collector")
    ap.add_argument("--quick", action="store_true", help="4 jobs, 8 s a phase at --slurm-refresh 1")
    args = ap.parse_args()
    if args.quick:
        args.jobs, args.duration, args.refresh = 4, 8.0, 1.0
    tmp = Path(tempfile.mkdtemp(prefix="cw-bench-scontrol-"))
    try:
        with running_slurm_cluster() as cluster, Children() as children:
            ids = []
            for _ in range(args.jobs):
                out = cluster.run(["sbatch", "--parsable", "-n1", "--mem=1", "-o", "/dev/null",
                                   "--wrap", "sleep 3600"])
                ids.append(out.stdout.strip().split(";")[0])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                states = subprocess.run(["squeue", "-h", "-o", "%T"], env=cluster.env, capture_output=True,
                                        text=True).stdout.split()
                if states.count("RUNNING") == len(ids):
                    break
                time.sleep(0.3)
            running = states.count("RUNNING")
            try:
                one, wall_one = run_phase(children, tmp, cluster.env, ["single"], [[]], args.duration, args.refresh)
                addresses = [f"127.0.0.1:{free_port()}" for _ in range(args.shards)]
                everyone = ",".join(addresses)
                names = [f"shard{i}" for i in range(args.shards)]
                extras = [["--listen", a, "--collectors", everyone, "--shard", a] for a in addresses]
                shards, wall_shards = run_phase(children, tmp, cluster.env, names, extras, args.duration,
                                                args.refresh)
            finally:
                for job in ids:
                    cluster.run(["scancel", job], check=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def per_min(c: dict[str, int], wall: float) -> list[str]:
        return [f"{c[k] * 60 / wall:.1f}" for k in KINDS] + [f"{sum(c.values()) * 60 / wall:.1f}"]

    def records(c: dict[str, int], wall: float) -> str:
        return f"{(c['listing'] * len(ids) + c['one job']) * 60 / wall:.0f}"

    rows = [["one collector", *per_min(one[0][0], wall_one), records(one[0][0], wall_one), str(one[0][1])]]
    total = dict.fromkeys(KINDS, 0)
    for name, (c, probes) in zip(names, shards, strict=True):
        rows.append([name, *per_min(c, wall_shards), records(c, wall_shards), str(probes)])
        for k in KINDS:
            total[k] += c[k]
    rows.append([f"{args.shards} shards in all", *per_min(total, wall_shards), records(total, wall_shards),
                 str(sum(p for _, p in shards))])
    ratio = sum(total.values()) / wall_shards / max(1e-9, sum(one[0][0].values()) / wall_one)
    print(table(f"Slurm client calls a minute: one collector, then {args.shards} shards, against the same jobs",
                ["collector", *KINDS, "all", "records/min", "start probes"], rows,
                [f"real Slurm ({cluster.env.get('SLURM_CONF')}), {running} of {args.jobs} jobs running; "
                 f"--slurm-refresh {args.refresh:g} s; {wall_one:.0f} s and {wall_shards:.0f} s measured",
                 "listing: squeue --json, or scontrol show job -d (every job); one job: scontrol show job -d ID; "
                 "owners: squeue -j ID (text path)",
                 "records/min: job records Slurm printed (a listing prints every job it holds, pending too)",
                 f"shards in all / one collector: {ratio:.2f}× the calls"]), flush=True)


if __name__ == "__main__":
    main()
