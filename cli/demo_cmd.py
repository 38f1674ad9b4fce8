"""`clusterwatch demo`: the whole system on one machine, no GPU and no Slurm needed.

Starts a real collector and two real agents as separate processes (nodes
demo-node1 and demo-node2, simulated GPUs), runs a small four-rank workload on them
as one job (rank 3 keeps growing its host and simulated GPU memory), shows the job's
status live, and ends by itself after --duration seconds, leaving no process behind,
also when interrupted: Ctrl-C, SIGTERM or SIGHUP stop everything it started and remove its
temporary folder; it then exits 128+N for signal N (130 for Ctrl-C).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from importlib import resources

import click

from .common import fail
from .help_text import examples
from .proctree import parent_death_signal

NODES = ("demo-node1", "demo-node2")
RANKS_PER_NODE = 2
LEAKING_RANK = 3


def _demo_rules() -> str | None:
    """The demo's rules file (short windows, so a leak shows within a minute), if shipped."""
    try:
        path = resources.files("clusterwatch.collector.rules") / "demo_rules.toml"
    except ModuleNotFoundError:
        return None
    return str(path) if path.is_file() else None


def _start_rank(rank: int, node: str, job_id: str, workdir: str, stack, sim_run: str) -> subprocess.Popen:
    env = dict(os.environ)
    local = rank % RANKS_PER_NODE
    env.update({
        "RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(RANKS_PER_NODE * len(NODES)),
        "CLUSTERWATCH_SIM_GPU": str(local), "CLUSTERWATCH_SIM_NODE": node,
        "CLUSTERWATCH_SIM_PROFILE": "steady", "CLUSTERWATCH_SIM_RUN": sim_run,
        "CLUSTERWATCH_SIM_GPU_MEM_FILE": os.path.join(workdir, f"gpu-mem-rank{rank}"),
        "CLUSTERWATCH_TRAIN_SOCKET": str(stack.train_socket(node)),
    })
    # by its file, so its git provenance is the code's (a clone's, where clusterwatch is installed from one); -I: the
    # file's folder (cli/) is not put on sys.path, nor the caller's PYTHON* settings applied
    args = [sys.executable, "-I", str(resources.files("clusterwatch.cli") / "demo_workload.py"), "--rank", str(rank)]
    if rank == LEAKING_RANK:
        args += ["--leak-mib-per-s", "6", "--gpu-leak-mib-per-s", "40"]
    log = open(os.path.join(workdir, f"rank{rank}.log"), "ab")
    # in the demo's folder, not the caller's: a clone's clusterwatch/ would shadow the package (see stack.py)
    proc = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            cwd=stack.workdir, start_new_session=True, preexec_fn=parent_death_signal())
    log.close()
    return proc


@click.command(epilog=examples(
    "clusterwatch demo",
    "clusterwatch demo --duration 120 --keep demo-logs",
))
@click.option("--duration", type=click.FloatRange(min=5), default=60.0, show_default=True,
              help="Seconds the demo runs before it ends by itself.")
@click.option("--interval", type=click.FloatRange(min=0.2), default=1.0, show_default=True,
              help="Agents' poll interval in seconds.")
@click.option("--refresh", type=click.FloatRange(min=0.5), default=3.0, show_default=True,
              help="Seconds between status refreshes.")
@click.option("--keep", type=click.Path(file_okay=False), default=None,
              help="Keep the store and logs in this folder.")
def demo(duration: float, interval: float, refresh: float, keep: str | None) -> None:
    """Run a collector, two simulated-GPU agents and a leaking four-rank job; show it live."""
    from clusterwatch.agent.spool import write_event

    from clusterwatch.errors import ClusterwatchError
    from clusterwatch.model import JobEvent
    from clusterwatch.report import render

    from .run_cmd import _final_view
    from .stack import Stack, make_workdir
    from .status_cmd import fetch_job
    from .stop_signals import StopSignals, name

    # absolute: the embedded processes run in it, not in the caller's folder
    workdir = make_workdir(keep, "clusterwatch-demo-")
    stack = Stack(workdir)
    ranks: list[subprocess.Popen] = []
    job_id = f"demo-{os.getpid()}"
    # The demo's simulated GPUs play its own ranks only, not another demo's or a test's on this host.
    sim_run = f"{job_id}-{uuid.uuid4().hex[:8]}"
    tty = sys.stdout.isatty()
    with StopSignals() as signals:
        try:
            rules = _demo_rules()
            try:
                # the demo's page may act: the stack's collector answers only this user's connections there
                # (--web-owner-uid: every user of the host reaches loopback) and opts in to their actions
                stack.start_collector(["--web-actions", *(["--rules", rules] if rules else [])], metrics=True)
            except ClusterwatchError as exc:
                fail(str(exc))
            now = time.time()
            for node in NODES:
                stack.spool(node).mkdir(parents=True, exist_ok=True)
                gpus = [f"{i}" for i in range(RANKS_PER_NODE)]
                write_event(str(stack.spool(node)), JobEvent("start", job_id, now, os.getuid(),
                                                             gpu_indexes=",".join(gpus)))
            for n, node in enumerate(NODES):
                if signals.received:
                    break
                node_ranks = [_start_rank(n * RANKS_PER_NODE + i, node, job_id, workdir, stack, sim_run)
                              for i in range(RANKS_PER_NODE)]
                ranks += node_ranks
                pid_args = [a for p in node_ranks for a in ("--pid", str(p.pid))]
                stack.start_agent(node, ["--gpu-source", "sim", "--sim-run", sim_run, "--interval", str(interval),
                                         "--send-interval", "0", "--job-id", job_id, *pid_args])
            if not signals.received:
                click.echo(f"clusterwatch demo: collector on {stack.address}, /metrics on "
                           f"http://127.0.0.1:{stack.metrics_port}/metrics, job {job_id} on {', '.join(NODES)}; "
                           f"rank {LEAKING_RANK} leaks host and GPU memory.")
                if stack.web_port:
                    click.echo(f"The job's page: http://127.0.0.1:{stack.web_port}/jobs/{job_id}")
                if rules:
                    click.echo("The demo uses demo_rules.toml: leak windows of seconds, not hours, "
                               "so the leak is flagged within the minute.")
                logs = (f"Logs in {workdir}." if keep
                        else "Logs go with the demo's temporary folder at its end (--keep DIR keeps them).")
                click.echo(f"{logs} Ends by itself after {duration:.0f} s; Ctrl-C ends it sooner.\n")
            end = time.monotonic() + duration
            while time.monotonic() < end and not signals.received:
                _sleep_unless(signals, min(refresh, max(0.0, end - time.monotonic())))
                if signals.received:
                    break
                try:
                    text = render(fetch_job(stack.address, job_id))
                except Exception as exc:  # first samples not in yet, or a transient error
                    text = f"waiting for the first samples ({type(exc).__name__})\n"
                if tty:
                    _out("\x1b[H\x1b[2J" + text)
                else:
                    _out(f"--- {time.strftime('%H:%M:%S %Z')}\n{text}")
            if not signals.received:
                _out("\nDemo time is up: the demo stops its workload (SIGTERM; its ranks exit 0) and closes the job.\n")
                _stop_ranks(ranks)
                now = time.time()
                for node in NODES:
                    write_event(str(stack.spool(node)), JobEvent("end", job_id, now, os.getuid(), exit_code=0))
                view = _final_view(stack, job_id, fetch_job, timeout=max(5.0, 4 * interval),
                                   give_up=lambda: bool(signals.received))
                if view is not None and not signals.received:
                    caught = any(a.state == "firing" or a.ended_while_firing for a in view.alerts)
                    _out("\nThe job's summary as stored when it ended (`clusterwatch status` shows it after a job). "
                         "The demo ended the job; it did not crash"
                         + (f", and the Alerts below were caught while rank {LEAKING_RANK} ran" if caught else "")
                         + ".\n\n")
                    _out(render(view))
            if signals.received:
                _say(f"\nInterrupted ({name(signals.received[0])}): stopping everything the demo started.")
        finally:
            _stop_ranks(ranks)
            stack.stop()
            if keep is None:
                import shutil

                shutil.rmtree(workdir, ignore_errors=True)
    if signals.received:
        sys.exit(signals.exit_code)


def _sleep_unless(signals, seconds: float) -> None:
    """Sleep, waking within 0.1 s of a stop signal (the handler only records it)."""
    end = time.monotonic() + seconds
    while not signals.received and time.monotonic() < end:
        time.sleep(min(0.1, max(0.0, end - time.monotonic())))


def _out(text: str, err: bool = False) -> None:
    try:
        click.echo(text, err=err, nl=False)
    except OSError:  # a terminal that hung up (SIGHUP): the cleanup goes on
        pass


def _say(text: str) -> None:
    _out(text + "\n", err=True)


def _stop_ranks(ranks: list[subprocess.Popen]) -> None:
    for p in ranks:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in ranks:
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
