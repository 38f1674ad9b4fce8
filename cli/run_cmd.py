"""`clusterwatch run -- CMD ARGS…`: watch one command on this machine, no Slurm needed.

Starts an embedded collector and agent on loopback with a temporary store, runs the
command, treats its process tree as the job `local-PID`, prints a one-line status
now and then, and when the command ends prints the job's report and exits with the
command's own exit code.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import click

from .common import fail


def _status_line(view) -> str:
    from .render import human_bytes, human_duration

    procs = [p for p in view.processes if p.alive]
    rss = sum(p.rss_bytes for p in procs if p.HasField("rss_bytes"))
    gmem = sum(p.gpu_memory_bytes for p in procs if p.HasField("gpu_memory_bytes"))
    cpu = sum(p.cpu_percent for p in procs if p.HasField("cpu_percent"))
    firing = [a.rule for a in view.alerts if a.state == "firing"]
    run = view.now - view.job.start_time if view.job.start_time else 0
    line = (f"[clusterwatch] {view.job.job_id} {human_duration(run)}  procs {len(procs)}  cpu {cpu:.0f}%  "
            f"rss {human_bytes(rss)}  gpu mem {human_bytes(gmem)}")
    if firing:
        line += f"  ALERTS: {', '.join(sorted(set(firing)))}"
    return line


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True,
              help="Poll interval in seconds.")
@click.option("--status-every", type=click.FloatRange(min=0), default=15.0, show_default=True,
              help="Print a status line to stderr every N seconds (0: never).")
@click.option("--gpu-source", type=click.Choice(["auto", "nvml", "sim", "none"]), default="auto",
              show_default=True)
@click.option("--rules", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Rules file for the embedded collector.")
@click.option("--json", "as_json", is_flag=True, help="Print the final summary as JSON.")
@click.option("--summary-dir", type=click.Path(file_okay=False, exists=True), default=None,
              help="Also write the job's JSON summary (clusterwatch-local-PID.json) into this folder.")
@click.option("--keep", type=click.Path(file_okay=False), default=None,
              help="Keep the store and logs in this folder instead of a temporary one.")
def run(command, interval, status_every, gpu_source, rules, as_json, summary_dir, keep) -> None:
    """Run COMMAND and watch its whole process tree (use `--` before the command)."""
    from clusterwatch.agent.spool import write_event

    from clusterwatch.errors import ClusterwatchError
    from clusterwatch.model import JobEvent

    from .stack import Stack
    from .status_cmd import fetch_job, view_as_dict

    workdir = keep or tempfile.mkdtemp(prefix="clusterwatch-run-")
    os.makedirs(workdir, exist_ok=True)
    stack = Stack(workdir)
    node = socket.gethostname().split(".")[0]
    child = None
    code = 1
    try:
        try:
            extra = ["--rules", rules] if rules else []
            if summary_dir:
                extra += ["--summary-dir", os.path.abspath(summary_dir)]
            stack.start_collector(extra)
        except ClusterwatchError as exc:
            fail(str(exc))
        try:
            # the command reports training progress (clusterwatch.train) to the embedded agent
            env = dict(os.environ, CLUSTERWATCH_TRAIN_SOCKET=str(stack.train_socket(node)))
            child = subprocess.Popen(list(command), env=env)
        except FileNotFoundError:
            fail(f"command not found: {command[0]}", code=127)
        except PermissionError:
            fail(f"command not executable: {command[0]}", code=126)
        job_id = f"local-{child.pid}"
        write_event(str(stack.spool(node)), JobEvent("start", job_id, time.time(), os.getuid()))
        # one machine, a few processes: every poll goes out, so what is shown is never behind
        stack.start_agent(node, ["--pid", str(child.pid), "--job-id", job_id, "--interval", str(interval),
                                 "--send-interval", "0", "--gpu-source", gpu_source])
        click.echo(f"[clusterwatch] watching {job_id} ({' '.join(command)}); "
                   f"collector on {stack.address}", err=True)
        last_line = time.monotonic()
        while True:
            try:
                code = child.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                pass
            except KeyboardInterrupt:
                # the terminal sent SIGINT to the command too; wait for it to end
                continue
            if status_every and time.monotonic() - last_line >= status_every:
                last_line = time.monotonic()
                try:
                    click.echo(_status_line(fetch_job(stack.address, job_id)), err=True)
                except Exception:
                    pass  # the first samples may not have arrived yet
        if code < 0:  # killed by a signal: report it the way a shell does
            code = 128 - code
        write_event(str(stack.spool(node)), JobEvent("end", job_id, time.time(), os.getuid(), exit_code=code))
        view = _final_view(stack, job_id, fetch_job, timeout=max(5.0, 3 * interval))
        if view is None:
            click.echo(f"[clusterwatch] no samples of {job_id} reached the collector; "
                       f"see {workdir}/agent-{node}.log", err=True)
        elif as_json:
            import json

            click.echo(json.dumps(view_as_dict(view), indent=2, sort_keys=True), err=True)
        else:
            from .render import render

            click.echo("\n" + render(view), err=True, nl=False)
    finally:
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(5)
            except subprocess.TimeoutExpired:
                child.kill()
        stack.stop()
        if keep is None:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(code)


def _final_view(stack, job_id: str, fetch_job, timeout: float):
    """Wait until the collector has closed the job (the agent passed on the end event); its view."""
    import grpc

    deadline = time.monotonic() + timeout
    view = None
    while time.monotonic() < deadline:
        try:
            view = fetch_job(stack.address, job_id)
            if view.job.end_time:
                return view
        except grpc.RpcError:
            pass
        time.sleep(0.2)
    return view
