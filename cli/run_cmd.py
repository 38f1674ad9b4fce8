"""`clusterwatch run -- CMD ARGS…`: watch one command on this machine, no Slurm needed.

Starts an embedded collector and agent on loopback with a temporary store, runs the
command, treats its process tree as the job `local-PID`, prints a one-line status
now and then, and when the command ends prints the job's report and exits with the
command's own exit code.

Stopped by a signal (SIGTERM from kill, timeout or scancel; SIGHUP from a dropped SSH session;
Ctrl-C), it passes the signal on, stops the command's whole tree, the collector and the agent,
removes its temporary folder, prints the report and exits 128+N, as a shell reports a command
signal N ended. Whatever the command leaves running when it ends is stopped too, as Slurm does
at a job's end.

The job's page in a browser is opt-in (--web-listen): the embedded collector otherwise opens no TCP
port. The page has no login (the collector's queries are unauthenticated: its socket is private), so it
is served on loopback only, read-only unless --web-actions, and to the user's own connections only
(--web-owner-uid: the kernel names a loopback connection's owner; every user of the host reaches
loopback). Off loopback no connection's user is known, so such an address is refused, whatever else is
said: a page for another host goes through an SSH tunnel (whose connection the user's sshd makes).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import click

from .common import fail
from .help_text import examples

# between passing a stop signal to the command and SIGKILL to its tree: well inside Slurm's KillWait
# (30 s by default), after which scancel kills us too and no report is printed
GRACE_S = 5.0
REAP_EVERY_S = 2.0  # orphans that exit become our zombies (we are their subreaper)


def _loopback_web_listen(ctx: click.Context, param: click.Parameter, value: str) -> str | None:
    """--web-listen of `run`: 'none' (no page: None), or a loopback HOST:PORT; anything else one line, exit 2."""
    import ipaddress

    from .addresses import AddressError, split_host_port

    if value is None or value.strip().lower() == "none":
        return None
    try:
        host, port = split_host_port(value, port_zero=True)
    except AddressError as exc:
        raise click.BadParameter(str(exc)) from None
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host.lower() == "localhost"  # a name resolving elsewhere: the collector binds what it says
    if not loopback:
        raise click.BadParameter(
            f"{value!r}: the page of `run` has no login, so it is served on loopback only, to your own "
            f"connections (on {host} anyone who reached it would see your command, and with --web-actions stop "
            f"it); give 127.0.0.1:PORT and, from another host, tunnel to it: ssh -L PORT:127.0.0.1:PORT THIS-HOST")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _page_url(listen: str, port: int, job_id: str) -> str:
    """The job page's address on the port the collector bound (listen may ask for port 0)."""
    host = listen.rpartition(":")[0]
    return f"http://{host}:{port}/jobs/{job_id}"


def _status_line(view) -> str:
    from clusterwatch.report.text import human_bytes, human_duration, printable_message

    view = printable_message(view)
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


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
               epilog=examples(
    "clusterwatch run -- python train.py --epochs 3",
    "clusterwatch run --gpu-source sim -- python train.py",
    "clusterwatch run --json -o report.json -- ./train.sh",
    "clusterwatch run --web-listen 127.0.0.1:0 -- python train.py",
))
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True,
              help="Poll interval in seconds.")
@click.option("--status-every", type=click.FloatRange(min=0), default=15.0, show_default=True,
              help="Print a status line to stderr every N seconds (0: never).")
@click.option("--gpu-source", type=click.Choice(["auto", "nvml", "sim", "none"]), default="auto",
              show_default=True,
              help="Where GPU data comes from: nvml (the NVIDIA driver), sim (simulated GPUs that play the "
                   "command's processes, for a machine without one), none; auto: nvml where a driver is, else none.")
@click.option("--rules", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Rules file for the embedded collector.")
@click.option("--json", "as_json", is_flag=True,
              help="The final report as JSON, on stdout once the command has ended (the report is on stderr "
                   "otherwise: stdout is the command's).")
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False), default=None,
              help="Write the final report (JSON with --json) to this file instead.")
@click.option("--summary-dir", type=click.Path(file_okay=False, exists=True), default=None,
              help="Also write the job's JSON summary (clusterwatch-local-PID.json) into this folder.")
@click.option("--keep", type=click.Path(file_okay=False), default=None,
              help="Keep the store and logs in this folder instead of a temporary one.")
@click.option("--web-listen", default="none", show_default=True, metavar="HOST:PORT", callback=_loopback_web_listen,
              help="Serve the job's page here, on loopback only (127.0.0.1:0: a free port; the address is "
                   "printed at start), to your own connections only (and root's).")
@click.option("--web-actions", is_flag=True,
              help="Offer Diagnose, Request checkpoint and Stop on the page (with --web-listen).")
def run(command, interval, status_every, gpu_source, rules, as_json, output, summary_dir, keep, web_listen,
        web_actions) -> None:
    """Run COMMAND and watch its whole process tree (use `--` before the command)."""
    from clusterwatch.agent.spool import write_event

    from clusterwatch.errors import ClusterwatchError
    from clusterwatch.grpc_fork import as_the_caller_had_it
    from clusterwatch.model import JobEvent

    from .held_command import HeldCommand, start_failure
    from .proctree import become_subreaper
    from .stack import Stack, make_workdir
    from .status_cmd import fetch_job
    from .stop_signals import StopSignals

    # absolute: the embedded processes run in it, not in the caller's folder
    if output and not os.access(os.path.dirname(os.path.abspath(output)), os.W_OK):
        fail(f"cannot write the report to {output}: its folder does not exist or is not writable")
    if web_actions and web_listen is None:
        fail("--web-actions offers its buttons on the job's page: give --web-listen 127.0.0.1:0 too")
    workdir = make_workdir(keep, "clusterwatch-run-")
    stack = Stack(workdir)
    node = socket.gethostname().split(".")[0]
    child = None
    command_tree = None
    code = 1
    # orphans of the command (a double fork, a parent that died first) come to us, not to init
    become_subreaper()
    with StopSignals() as signals:
        try:
            try:
                # absolute: the collector runs in the stack's folder
                extra = ["--rules", os.path.abspath(rules)] if rules else []
                if summary_dir:
                    extra += ["--summary-dir", os.path.abspath(summary_dir)]
                if web_listen is not None:
                    # after the stack's own --web-listen none (the last one counts); actions said either way,
                    # so that a CLUSTERWATCH_WEB_ACTIONS meant for the cluster's collector does not switch
                    # them on here; the page this user's alone, as the collector's socket is
                    extra += ["--web-listen", web_listen, "--web-actions" if web_actions else "--no-web-actions",
                              "--web-owner-uid", str(os.getuid())]
                stack.start_collector(extra)
            except ClusterwatchError as exc:
                fail(str(exc))
            if signals.received:  # stopped while the collector started: nothing of the user's ran yet
                sys.exit(signals.exit_code)
            # the command reports training progress (clusterwatch.train) to the embedded agent
            env = as_the_caller_had_it(dict(os.environ, CLUSTERWATCH_TRAIN_SOCKET=str(stack.train_socket(node))))
            # simulated GPUs play this command's processes, not others on the host (unless the caller
            # named a run of their own)
            sim_run = env.get("CLUSTERWATCH_SIM_RUN") or f"run-{uuid.uuid4().hex[:12]}"
            env["CLUSTERWATCH_SIM_RUN"] = sim_run
            # held until the agent listens for its reports: none of its first ones is lost
            held = HeldCommand(list(command), env)
            child = held.process
            command_tree = CommandTree(child, stack)
            job_id = f"local-{child.pid}"
            write_event(str(stack.spool(node)), JobEvent("start", job_id, time.time(), os.getuid()))
            # one machine, a few processes: every poll goes out, so what is shown is never behind; the first
            # poll waits for the command to start (SIGUSR1), so even a command shorter than a poll is sampled
            agent = stack.start_agent(node, ["--pid", str(child.pid), "--job-id", job_id, "--interval", str(interval),
                                     "--send-interval", "0", "--gpu-source", gpu_source, "--sim-run", sim_run,
                                     "--poll-on-sigusr1"])
            try:
                stack.wait_for_agent(node, agent)
            except ClusterwatchError as exc:  # an unwatched command is not run
                held.cancel()
                log = f"agent-{node}.log"
                fail(f"{exc}; the command was not run "
                     + (f"(the agent's log: {workdir}/{log})" if keep is not None else "(--keep DIR keeps its log)"))
            if signals.received:  # stopped while the agent started: the command never runs
                held.cancel()
                sys.exit(signals.exit_code)
            try:
                held.release()
            except OSError as exc:
                reason, start_code = start_failure(exc)
                fail(f"{reason}: {command[0]}", code=start_code)
            agent.send_signal(signal.SIGUSR1)  # the command sampled as it starts
            from clusterwatch.report.text import printable

            _say(f"[clusterwatch] watching {job_id} ({printable(' '.join(command))}); collector on {stack.address}")
            if web_listen is not None:  # a --web-listen given is bound or the collector did not start
                what = "with Diagnose, Request checkpoint and Stop" if web_actions else "read-only"
                url = _page_url(web_listen, stack.web_port, job_id)
                _say(f"[clusterwatch] the job's page: {url} ({what}; for your own browser only)")
            code = _supervise(command_tree, signals, status_every,
                              lambda: _status_line(fetch_job(stack.address, job_id)))
            if signals.received:  # what a shell reports for a command a signal ended
                code = signals.exit_code
            write_event(str(stack.spool(node)),
                        JobEvent("end", job_id, time.time(), os.getuid(), exit_code=code))
            if agent.poll() is None:
                agent.send_signal(signal.SIGUSR1)  # a poll at the end: what is left of the tree, and the end event
            seen = len(signals.received)
            view = _final_view(stack, job_id, fetch_job, timeout=max(5.0, 3 * interval),
                               give_up=lambda: len(signals.received) > seen)
            if view is None:
                _say(f"[clusterwatch] no samples of {job_id} reached the collector; "
                     + _agent_said(agent, stack.log_tail(f"agent-{node}", 1), keep, f"{workdir}/agent-{node}.log"))
            else:
                _report(view, as_json, output)
        finally:
            if command_tree is not None:
                command_tree.stop()
            stack.stop()
            if keep is None:
                import shutil

                shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(code)


def _agent_said(agent: subprocess.Popen, last_line: str, keep: str | None, log_path: str) -> str:
    """Why no sample came: the embedded agent's own last line where it stopped (its log goes with the run's
    folder unless --keep)."""
    if agent.poll() not in (None, 0) and last_line:
        said = f"the agent stopped: {last_line.strip()}"
    else:
        said = "the agent sent none"
    return f"{said} (its log: {log_path})" if keep is not None else f"{said} (--keep DIR keeps its log)"


def _report(view, as_json: bool, output: str | None) -> None:
    """The final report: to `output`, else JSON to stdout (machine output) or text to stderr."""
    if as_json:  # the document status --json prints (docs/json.md)
        from clusterwatch.json_view import dumps, status_document

        text = dumps(status_document(view))
    else:
        from clusterwatch.report import render

        text = render(view)
    if output:
        try:
            with open(output, "w") as f:
                f.write(text)
        except OSError as exc:
            _say(f"clusterwatch: cannot write the report to {output}: {exc.strerror}")
            return
        _say(f"[clusterwatch] report written to {output}")
    elif as_json:
        try:
            click.echo(text, nl=False)
        except OSError:  # stdout gone (a closed pipe, a hung-up terminal): the cleanup goes on
            pass
    else:
        _say("\n" + text, nl=False)


def _say(text: str, nl: bool = True) -> None:
    """A line to stderr; a terminal that hung up (SIGHUP) must not stop the cleanup that follows."""
    try:
        click.echo(text, err=True, nl=nl)
    except OSError:
        pass


class CommandTree:
    """The user's command and every process it started (orphans included: we are their subreaper)."""

    def __init__(self, child: subprocess.Popen, stack) -> None:
        self.child = child
        self._stack = stack

    def _ours(self) -> set[int]:
        # the Popen children whose exit status their Popen objects collect
        return {p.pid for _, p in self._stack.children} | {self.child.pid}

    def pids(self) -> set[int]:
        """Every live process below us except the embedded collector and agent (and what they run)."""
        from .proctree import descendants

        return descendants(os.getpid(), exclude={p.pid for _, p in self._stack.children})

    def signal(self, sig: int, whole_tree: bool) -> int:
        """Send `sig` to the command, or to its whole tree; how many processes it went to."""
        from .proctree import signal_all

        pids = self.pids() if whole_tree else {self.child.pid}
        signal_all(pids, sig)
        return len(pids)

    def reap(self) -> None:
        from .proctree import reap_orphans

        reap_orphans(self._ours())

    def stop(self, grace_s: float = GRACE_S) -> None:
        """SIGTERM whatever of the tree still runs, SIGKILL after `grace_s`."""
        from .proctree import stop_all

        stop_all(self.pids, self._ours(), grace_s)
        if self.child.poll() is None:
            self.child.wait()


def _supervise(tree: CommandTree, signals, status_every: float, status_line) -> int:
    """Wait for the command, acting on the stop signals as they come; its exit code (128+N for signal N).

    SIGTERM and SIGHUP are passed to the command, and SIGKILL follows after GRACE_S. Ctrl-C reaches the
    command from the terminal (or is passed on when it did not); a second one sends SIGTERM to the whole
    tree (a command that ignores SIGINT), a third SIGKILL.
    """
    from .stop_signals import name, terminal_sends_sigint_to_the_group

    child = tree.child
    acted = interrupts = 0
    kill_at = None
    last_line = last_reap = time.monotonic()
    while True:
        try:
            code = child.wait(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        for sig in signals.received[acted:]:
            acted += 1
            if sig != signal.SIGINT:
                tree.signal(sig, whole_tree=False)
                kill_at = kill_at or now + GRACE_S
                _say(f"[clusterwatch] {name(sig)}: passed to the command; "
                     f"SIGKILL to its processes if they still run in {GRACE_S:.0f} s")
                continue
            interrupts += 1
            if interrupts == 1:
                if not terminal_sends_sigint_to_the_group():
                    tree.signal(signal.SIGINT, whole_tree=False)
                _say("[clusterwatch] waiting for the command to end; Ctrl-C again stops it")
            elif interrupts == 2:
                n = tree.signal(signal.SIGTERM, whole_tree=True)
                kill_at = now + GRACE_S
                _say(f"[clusterwatch] SIGTERM to the command's {n} process(es); "
                     f"SIGKILL in {GRACE_S:.0f} s, or at the next Ctrl-C")
            else:
                tree.signal(signal.SIGKILL, whole_tree=True)
        if kill_at is not None and now >= kill_at:
            tree.signal(signal.SIGKILL, whole_tree=True)
            kill_at = now + 1.0  # again, for any process forked meanwhile
        if now - last_reap >= REAP_EVERY_S:
            last_reap = now
            tree.reap()
        if status_every and now - last_line >= status_every:
            last_line = now
            try:
                _say(status_line())
            except Exception:
                pass  # the first samples may not have arrived yet
    if code < 0:  # killed by a signal: report it the way a shell does
        code = 128 - code
    return code


def _final_view(stack, job_id: str, fetch_job, timeout: float, give_up=lambda: False):
    """Wait until the collector has closed the job (the agent passed on the end event); its view.

    `give_up()` true (another Ctrl-C) stops the wait early, with what the collector has so far.
    """
    import grpc

    deadline = time.monotonic() + timeout
    view = None
    while time.monotonic() < deadline and not give_up():
        try:
            view = fetch_job(stack.address, job_id)
            if view.job.end_time:
                return view
        except grpc.RpcError:
            pass
        time.sleep(0.2)
    return view
