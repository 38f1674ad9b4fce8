"""The agent's life on a node: its sources built from the config, the stream, the poll loop, the shutdown order.

`clusterwatch agent` turns flags into an AgentConfig and calls AgentRuntime.from_config(config).run(stop);
benchmarks and tests build it the same way, so they run what the agent runs.
"""
from __future__ import annotations

import logging
import os
import select
import signal
import socket
import threading
import time

from clusterwatch.errors import ClusterwatchError, ConfigError
from clusterwatch.tls import channel_credentials

from .agent import Agent, PollJoiner, run_loop, submit, write_pid_file
from .config import AgentConfig
from .munge_credential import munge_credentials
from .roots import WatchedRoots
from .shard_streams import ShardedSender
from .stream import BufferBudget, Sender, SenderCounters

log = logging.getLogger("clusterwatch.agent")

# How long the shutdown waits for the collector to acknowledge what is buffered: the unit's stop
# allows 20 s in all (deploy/systemd/clusterwatch-agent.service), and a collector that is away must
# not hold the node's shutdown.
FLUSH_TIMEOUT_S = 5.0


class SpoolTaken(ClusterwatchError):
    """Another agent holds this node's spool folder: a second one would sample the node twice."""


class AgentRuntime:
    """One node's agent: the Agent (its sources) and, once run, its stream to the collector.

    Args:
        agent: the Agent with its sources.
        live: whether run() may be called (from_config opened the spool lock, the training socket
            and the provenance worker); a runtime for one poll (`--once`) or a benchmark is not live.
    """

    def __init__(self, agent: Agent, live: bool = True, credentials=None, spool_lock: int | None = None) -> None:
        self.agent = agent
        self._spool_lock = spool_lock
        self.config = agent.config
        self.live = live
        self._credentials = credentials
        self.sender: ShardedSender | None = None
        self._closed = False

    @classmethod
    def from_config(cls, config: AgentConfig, live: bool = True) -> AgentRuntime:
        """Build the agent's sources from `config`.

        `live` first reads the TLS files (ConfigError when one cannot be read), takes the spool folder's
        run lock (SpoolTaken when another agent has it), then opens the training-report socket and the
        provenance worker. A GPU source that cannot be opened as configured is a ConfigError; `auto`
        falls back to none with one line.
        """
        credentials = lock = None
        if live:
            credentials = channel_credentials(config.tls_ca, config.tls_cert, config.tls_key)
            lock = claim_spool(config.spool_dir)  # before anything is opened: a second agent must touch nothing
        try:
            return cls(build_agent(config, live=live), live=live, credentials=credentials, spool_lock=lock)
        except BaseException:
            if lock is not None:
                os.close(lock)
            raise

    def one_poll(self, settle_s: float = 0.5):
        """Two polls `settle_s` apart (CPU percentages need a previous reading); the second as (batch, samples)."""
        self.agent.poll()
        time.sleep(min(settle_s, self.config.interval_s))
        return self.agent.poll()

    def run(self, stop: threading.Event, wake: Wakeup | None = None) -> SenderCounters:
        """Poll and stream until `stop` is set; then a last poll, the flush and close(). The sender's counters.

        With `wake` (polls_on_sigusr1), the first poll waits until it is set, and each time it is set again a
        poll is taken at once: `clusterwatch run` starts its command between the agent's start and its first
        poll, and asks for a poll when the command has started and when it has ended.
        """
        if not self.live:
            raise RuntimeError("AgentRuntime.run needs a runtime built with live=True")
        config, agent = self.config, self.agent
        # whatever ends the run (a signal's stop, an error, an interrupt), close() removes the train
        # socket and lets go of the spool lock
        try:
            self.sender = sender = self.open_streams()
            write_pid_file(config.spool_dir)
            sender.start()
            if agent.health is not None:
                agent.health.start()
            if agent.tmpfs is not None:
                agent.tmpfs.start()
            log.info("agent on %s: polling every %.1fs, GPU source %s, collector %s",
                     config.node, config.interval_s, agent.gpus.name, describe(sender))
            joiner = PollJoiner(config.interval_s, config.send_interval_s, build_table=False)
            if wake is not None:
                wake.wait()  # set by SIGUSR1 or by a stop
                wake.clear()
            run_loop(agent, sender, stop, joiner, wake=wake)
            self._send_last_poll(joiner)
            sender.flush(timeout=FLUSH_TIMEOUT_S)
        finally:
            if self.sender is not None:
                self.sender.stop()
            self.close()
        return sender.counters

    def open_streams(self) -> ShardedSender:
        """A stream per collector of the deployment this agent has data for (its node's one at start)."""
        from clusterwatch.shards import Collectors

        config, agent = self.config, self.agent
        collectors = Collectors.parse(config.collector, config.collectors_before or None)
        on_signal = signal_handler(agent)  # shared: a job's collector asks only for the processes it holds
        on_train_request = train_asker(agent)  # likewise; None without a training socket
        # each stream to each collector proves root on this node with a credential of its own (good once)
        munge = munge_credentials(config.agent_auth, config.munge_socket)

        def make(address: str, budget: BufferBudget) -> Sender:
            return Sender(address, agent.hello, config.buffer_max_samples, token=config.token,
                          channel_credentials=self._credentials, on_signal=on_signal, budget=budget,
                          on_train_request=on_train_request, munge=munge)

        return ShardedSender(collectors, config.node, make, BufferBudget(config.buffer_max_samples))

    def _send_last_poll(self, joiner: PollJoiner) -> None:
        """A last poll, so the final state (a job's end event) goes out with the polls held."""
        try:
            due = joiner.add(*self.agent.poll_parts(), time.monotonic())
            if due is not None:
                submit(self.agent, self.sender, *due)
        except Exception:
            log.exception("the last poll failed; what was held is sent")
        held = joiner.take()
        if held is not None:
            submit(self.agent, self.sender, *held)

    def close(self) -> None:
        """Close the training endpoint (removing its socket), stop the provenance worker (no git of ours
        outlives the agent), close the GPU source, then let go of the spool lock; once."""
        if self._closed:
            return
        self._closed = True
        if self.agent.train_endpoint is not None:
            self.agent.train_endpoint.close()  # its socket goes with it
        if self.agent.provenance is not None:
            self.agent.provenance.stop()
        if self.agent.job_output is not None:
            self.agent.job_output.close()
        if self.agent.health is not None:
            self.agent.health.stop()  # before the GPU source: its threads call NVML
        if self.agent.tmpfs is not None:
            self.agent.tmpfs.stop()
        if self.agent.health_file is not None:
            self.agent.health_file.remove()  # no one keeps it current now: the gate must not trust it
        self.agent.gpus.close()
        if self._spool_lock is not None:
            os.close(self._spool_lock)
            self._spool_lock = None


def describe(sender: ShardedSender) -> str:
    """The collector(s) as the start line says them: the node's own, and how many the list has."""
    n = len(sender.collectors.all)
    return sender.node_collector if n == 1 else f"{sender.node_collector} (this node's, of {n}; one stream each " \
        "collector this node has data for)"


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT (call from the main thread)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop


class Wakeup:
    """An event a signal sets: a byte in a pipe, written by the interpreter's own C handler (set_wakeup_fd).

    A Python handler runs in the main thread between two of its instructions: one that took the lock of a
    threading.Event the interrupted code held would wait for itself forever, and a signal the kernel gave
    another thread (the agent has several) leaves a main thread asleep in select() asleep, its handler
    unrun, until something else wakes it.
    """

    def __init__(self) -> None:
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    @property
    def signal_fd(self) -> int:
        """The pipe's end to give signal.set_wakeup_fd."""
        return self._write

    def set(self) -> None:
        try:
            os.write(self._write, b"!")
        except BlockingIOError:  # full: it is set already
            pass

    def wait(self, timeout: float | None = None) -> bool:
        """Whether it is set, waiting up to `timeout` seconds (None: until it is)."""
        return bool(select.select([self._read], [], [], timeout)[0])  # retried across signals (PEP 475)

    def clear(self) -> None:
        try:
            while os.read(self._read, 64):
                pass
        except BlockingIOError:
            pass


def polls_on_sigusr1(stop: threading.Event) -> Wakeup:
    """What AgentRuntime.run's polls wait on: set by SIGUSR1 (a poll now) and, with `stop`, by SIGTERM
    and SIGINT. Call from the main thread, after stop_on_signals and before the training socket is bound:
    whoever sees that socket may send SIGUSR1 (whose default action would end the agent)."""
    wake = Wakeup()
    signal.set_wakeup_fd(wake.signal_fd, warn_on_full_buffer=False)  # any caught signal wakes the loop

    def stopping(*_) -> None:
        stop.set()
        wake.set()

    signal.signal(signal.SIGTERM, stopping)
    signal.signal(signal.SIGINT, stopping)
    signal.signal(signal.SIGUSR1, lambda *_: wake.set())
    return wake


def signal_handler(agent: Agent):
    """Delivers the signals the collector asks for, to processes this agent watches only."""
    from .signals import SignalHandler

    return SignalHandler(agent.procs.start_time, agent.procs.is_known)


def train_asker(agent: Agent):
    """Asks the training processes this agent watches what the collector asks for (agent/train_asks.py)."""
    if agent.train_endpoint is None:
        return None
    from .train_asks import TrainAsker

    return TrainAsker(agent.train_endpoint, agent.procs.start_time, agent.procs.is_known)


def claim_spool(spool_dir: str) -> int | None:
    """Take the spool folder's run lock: its descriptor, held until closed (the kernel lets go however the
    process ends); SpoolTaken when another agent has it.

    An unwritable folder cannot hold the pid file either: the agent runs unguarded, with one line (None).
    """
    from .ensure import PID_FILE, read_pid
    from .ensure import claim_spool as take_lock

    try:
        lock = take_lock(spool_dir)
    except OSError as exc:
        log.warning("cannot lock %s (%s): not guarded against a second agent", spool_dir, exc.strerror or exc)
        return None
    if lock is None:
        other = read_pid(os.path.join(spool_dir, PID_FILE))
        raise SpoolTaken(f"another agent runs for {spool_dir} (pid {other or 'unknown'}); this one exits, so the "
                         "node is not sampled twice")
    return lock


def build_agent(config: AgentConfig, live: bool = True) -> Agent:
    """The Agent with its sources; `live` also opens the training-report socket and the provenance worker."""
    from .labels import JobLabeler
    from .slurm_lookup import ProcLookup
    from .spool import JobSpool

    gpus = open_gpus(config)
    procs = open_procs(config)
    # each --pid root by its start time, taken now where it was not given: a pid reused later is not the root
    roots = WatchedRoots.taken_now(config.pids, config.local_job_id, procs.start_time, log)
    lookup = ProcLookup(node=config.node)
    cache: dict = {}
    labeler = JobLabeler(roots.jobs(), slurm_lookup=lookup.slurm_labels, local_lookup=lookup.rank_labels)
    spool = JobSpool(config.spool_dir, find_job_pids=lambda jobs: lookup.job_pids(jobs, cache))
    endpoint = provenance = health = None
    if not live:
        return Agent(config, gpus, procs, labeler, spool=spool, roots=roots)
    try:
        from .health.monitor import open_health

        health = open_health(gpus.name, config.kmsg, counters_every_s=config.health_interval_s, log=log,
                             sim_nvml=getattr(gpus, "health_nvml", None), ib_sysfs=config.ib_sysfs,
                             ib_expect=config.ib_expect)
        endpoint = open_train_endpoint(config.train_socket)
        if config.provenance:
            from .provenance_worker import ProvenanceWorker

            provenance = ProvenanceWorker()
        from .health_file import HealthFileWriter
        from .job_output import open_job_output
        from .tmpfs import TmpfsScanner

        health_file = HealthFileWriter(config.spool_dir) if health is not None else None
        tmpfs = TmpfsScanner(config.tmpfs_interval_s) if config.tmpfs_interval_s > 0 else None
        return Agent(config, gpus, procs, labeler, spool=spool, train_endpoint=endpoint,
                     provenance=provenance, health=health, roots=roots, job_output=open_job_output(config),
                     health_file=health_file, tmpfs=tmpfs)
    except BaseException:
        if endpoint is not None:  # nor does a failed start leave its socket behind
            endpoint.close()
        raise


PROCESS_SOURCES = ("auto", "proc", "psutil")


def open_procs(config: AgentConfig, proc_root: str = "/proc"):
    """The process source: the /proc reader where `proc_root` is a Linux /proc, psutil elsewhere (macOS);
    ConfigError for a source that cannot be used here."""
    kind = config.process_source
    if kind not in PROCESS_SOURCES:
        raise ConfigError(f"unknown process source {kind!r}; choose one of {', '.join(PROCESS_SOURCES)}")
    has_proc = os.path.exists(f"{proc_root}/self/stat")
    if kind == "auto":
        kind = "proc" if has_proc else "psutil"
    if kind == "psutil":
        from .backends.psutil_procs import PsutilProcSource

        return PsutilProcSource(config.node, count_fds=config.count_fds)
    if not has_proc:
        raise ConfigError(f"--process-source proc needs a Linux /proc ({proc_root} has none); "
                          "pass --process-source psutil or auto")
    from .backends.procs import ProcSource

    return ProcSource(config.node, proc=proc_root, count_fds=config.count_fds)


def open_gpus(config: AgentConfig):
    """The configured GPU source; ConfigError when it cannot be opened as asked."""
    try:
        from .backends.select import open_gpu_source
    except ImportError:  # the GPU backends are not installed in this build
        from .backends.gpu import NoGpuSource

        log.warning("no GPU backend available; running without GPU data")
        return NoGpuSource()
    return open_gpu_source(config.gpu_source, config.sim_scenario, log, node=config.node,
                           interval_s=config.interval_s, sim_run=config.sim_run,
                           activity_interval_s=config.activity_interval_s)


def open_train_endpoint(path: str | None):
    """Start listening for clusterwatch.train reports: the TrainEndpoint (closed by AgentRuntime.close,
    which removes its socket), or None (with one line) when the socket cannot be made."""
    if not path:
        return None
    if not hasattr(socket, "SO_PASSCRED"):  # the endpoint learns each sender's pid from Linux peer credentials
        log.warning("training reports need Linux peer credentials (SO_PASSCRED); running without them")
        return None
    from .train_endpoint import TrainEndpoint
    from .train_socket import SocketTaken

    endpoint = TrainEndpoint(path)
    try:
        endpoint.start()
    except SocketTaken as exc:  # another agent's socket: left alone; this agent still samples the node
        log.warning("%s", exc)
        return None
    except OSError as exc:
        log.warning("cannot listen for training reports on %s (%s); running without them. "
                    "Pass --train-socket with a writable path.", path, exc.strerror or exc)
        return None
    return endpoint


__all__ = ["AgentRuntime", "SpoolTaken", "build_agent", "claim_spool", "Wakeup", "polls_on_sigusr1", "stop_on_signals"]
