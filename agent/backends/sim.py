"""The simulated GPU source: a scenario of GPUs, used by real processes that opt in.

For machines without a GPU (demo, CI, docker-compose). A process on the host uses a
simulated GPU when its environment says so (read once per process from
`/proc/<pid>/environ`):

    CLUSTERWATCH_SIM_GPU=<index>[,<index>...]   the simulated GPU(s) it uses
    CLUSTERWATCH_SIM_PROFILE=<name>             a profile of the scenario (else the default)
    CLUSTERWATCH_SIM_GPU_BASE_MB=<MiB>          replaces the profile's memory_mib
    CLUSTERWATCH_SIM_GPU_MEM_FILE=<path>        its GPU memory in bytes, as text, read every
                                                poll; a number there wins over the curve
    CLUSTERWATCH_SIM_NODE=<node>                only the source of that node plays it (two
                                                simulated nodes on one host, as in the demo)
    CLUSTERWATCH_SIM_RUN=<token>                the run it belongs to: a source plays only the
                                                processes of its own run (`run=`), and a source
                                                with no run only those without one

A source adopts processes by what their environment says, anywhere on the host, so the run is
what keeps a demo, a test or a benchmark from playing another one's processes (or counting
their mistakes as its own): whoever starts a source and its processes gives both one token.

Curves run from each process's start time; noise is seeded by (pid, start time), so a
poll at a given time always reads the same. Device readings derive from the processes on
each GPU: memory = base + their memory, utilisation = their sum (at most 100 %), power
linear in utilisation. The scenario format is in `sim_scenario.py`.

A scenario's [[events]] (an XID, a lost GPU, throttling; `sim_nvml.py`) reach the agent's health readers
through `health_nvml`, in pynvml's place; a lost GPU also leaves this source's polls, as NVML's GPU_IS_LOST
does the NVML source's.
"""
from __future__ import annotations

import os
import select
import socket
import stat
import time
import uuid
from dataclasses import dataclass
from importlib import resources

from clusterwatch.agent.backends.gpu import GpuPoll
from clusterwatch.agent.backends.new_pids import NewPids
from clusterwatch.agent.backends.sim_nvml import SimNvml
from clusterwatch.agent.backends.sim_scenario import MiB, Profile, Scenario, parse_scenario

from clusterwatch import toml_file
from clusterwatch.model import GpuInfo, GpuReading, GpuUse
from clusterwatch.procfs import ExecInProgress, parse_btime, probe, read_environ

__all__ = ["SimGpuSource", "open_sim_source", "SimSpec", "parse_sim_environ", "DEFAULT_SCENARIO"]

DEFAULT_SCENARIO = "sim_default.toml"
ENV_GPU = b"CLUSTERWATCH_SIM_GPU"
ENV_RUN = "CLUSTERWATCH_SIM_RUN"
_UUID_NAMESPACE = uuid.UUID("6f1c3f0e-8f6a-4d2e-9a57-0c1a5d3b7e21")  # fixed: UUIDs stable across runs
_MEM_FILE_MAX = 32  # bytes read from a memory file: a number, nothing more


@dataclass(frozen=True, slots=True)
class SimSpec:
    """What a process's environment asks of the simulator."""

    gpus: tuple[int, ...]
    profile: str | None = None
    base_mib: float | None = None
    mem_file: str | None = None
    node: str | None = None


def parse_sim_environ(data: bytes, *, run: str | None = None) -> SimSpec | None:
    """Read the CLUSTERWATCH_SIM_* variables out of a `/proc/<pid>/environ` text.

    Args:
        data: the NUL-separated environment.
        run: the run whose processes are wanted: a process whose CLUSTERWATCH_SIM_RUN differs (set,
            or empty and unset alike, against None) is another run's.

    Returns:
        The spec, or None when the process does not use a simulated GPU or is another run's.

    Raises:
        ValueError: CLUSTERWATCH_SIM_GPU or CLUSTERWATCH_SIM_GPU_BASE_MB is not a number (for a
            process of this run only: another run's mistakes are not this one's to count).
    """
    if ENV_GPU not in data:  # most processes: no split, no decode
        return None
    env: dict[str, str] = {}
    for item in data.split(b"\0"):
        if item.startswith(b"CLUSTERWATCH_SIM_"):
            key, _, value = item.partition(b"=")
            env[key.decode()] = value.decode(errors="replace")
    gpu = env.get("CLUSTERWATCH_SIM_GPU", "").strip()
    if not gpu or (env.get(ENV_RUN) or None) != (run or None):
        return None
    indexes = tuple(int(part) for part in gpu.split(","))
    base = env.get("CLUSTERWATCH_SIM_GPU_BASE_MB")
    return SimSpec(
        gpus=indexes,
        profile=env.get("CLUSTERWATCH_SIM_PROFILE") or None,
        base_mib=float(base) if base else None,
        mem_file=env.get("CLUSTERWATCH_SIM_GPU_MEM_FILE") or None,
        node=env.get("CLUSTERWATCH_SIM_NODE") or None,
    )


@dataclass(slots=True)
class _Known:
    """A host process as last seen: its start time tells a reused pid apart; a played one has a pidfd."""

    start_ticks: int
    sim: _SimProc | None
    pidfd: int = -1


# Kinds whose memory curve is flat: their readings change only with the second of life (utilisation
# noise) and, for a stall, at the stall; they are computed once a second, not once a poll.
_FLAT_KINDS = ("steady", "idle", "stall")


@dataclass(slots=True)
class _SimProc:
    """A played process. Its utilisation is a function of its second of life (noise) and of which side of
    its stall it is on, so it is kept for the span of life [lo, hi) it holds for; so are the memory and
    the GpuUse readings of a flat curve."""

    start_time: float
    gpus: tuple[int, ...]
    profile: Profile
    base_bytes: int | None
    mem_file: str | None
    seed: int
    flat: bool = False
    stall_after_s: float = float("inf")
    lo: float = 1.0  # [lo, hi): seconds of life for which `sm` (and for a flat curve `used`, `uses`) hold
    hi: float = 0.0  # (empty at first)
    sm: float = 0.0
    used: int = 0
    uses: tuple[GpuUse, ...] = ()


class SimGpuSource:
    """Plays a scenario for the processes on this host that opt in through their environment.

    Args:
        scenario: the parsed scenario.
        node: this source's node name: the GPU UUIDs derive from it (two simulated
            nodes on one host must not share UUIDs), and a process that names a node in
            CLUSTERWATCH_SIM_NODE is played only by that node's source. Default: the
            host name.
        run: the run token: only processes whose CLUSTERWATCH_SIM_RUN is this are played
            (None: only processes without one).
        proc_root: where /proc is.
        started: when the source started (Unix seconds; default now): the scenario's events count from it.
    """

    name = "sim"

    def __init__(self, scenario: Scenario, *, node: str | None = None, run: str | None = None,
                 proc_root: str = "/proc", started: float | None = None) -> None:
        self.scenario = scenario
        self.run = run or None
        self._proc = proc_root
        node = node or socket.gethostname()
        self.node = node
        spec = scenario.gpus
        self._gpus = [
            GpuInfo(
                uuid="GPU-" + str(uuid.uuid5(_UUID_NAMESPACE, f"{node}/{i}")),
                index=i,
                name=spec.name,
                memory_total_bytes=spec.memory_bytes,
            )
            for i in range(spec.count)
        ]
        self._uuids = [g.uuid for g in self._gpus]
        events = [e for e in scenario.events if e.node is None or e.node == node]
        # the health readers' NVML (None: a scenario without events has no health to give)
        self.health_nvml = SimNvml(self._uuids, events, started=time.time() if started is None else started,
                                   temperature_c=spec.temperature_c) if events else None
        self._known: dict[int, _Known] = {}
        self._played: dict[int, _SimProc] = {}  # the processes of _known that use a simulated GPU
        # New processes are found from /proc/loadavg's last pid (a listing of /proc only now and then); a
        # played process's exit from its pidfd, all of them in one epoll call (which costs what the exits
        # since the last call cost, where poll() visits every pidfd).
        self._news = NewPids(proc_root)
        self._exits = select.epoll() if hasattr(select, "epoll") else select.poll()
        self._by_pidfd: dict[int, int] = {}
        self._pidfds = hasattr(os, "pidfd_open")
        self._boot_time = _boot_time(proc_root)
        self._tick = os.sysconf("SC_CLK_TCK")
        self._pending_errors = 0
        # Reads of /proc/<pid>/environ so far: once per new process, never per poll.
        self.environ_reads = 0

    def inventory(self) -> list[GpuInfo]:
        """The simulated GPUs, with UUIDs stable for a node name."""
        return list(self._gpus)

    def poll(self, now: float) -> GpuPoll:
        """Find the processes on simulated GPUs and read their curves at `now`.

        Args:
            now: Unix seconds; each curve is read at `now` minus its process's start time.

        Returns:
            Device readings, the processes by pid, and the count of processes whose
            environment asked for something the scenario does not have (once each).
        """
        self._scan()
        spec = self.scenario.gpus
        mem = [0] * spec.count
        util = [0.0] * spec.count
        room = spec.memory_bytes - spec.base_memory_bytes
        uuids = self._uuids
        out = GpuPoll()
        processes = out.processes
        for pid, sim in self._played.items():
            t = now - sim.start_time
            if sim.lo <= t < sim.hi:
                sm = sim.sm
                if sim.flat:
                    used = sim.used
                    for index in sim.gpus:
                        mem[index] += used
                        util[index] += sm
                    processes[pid] = list(sim.uses)
                    continue
            else:
                sm = sim.profile.utilization_at(t, sim.seed)
                if t >= 0.0:  # the span of life this utilisation holds for: this second, this side of a stall
                    lo = float(int(t))
                    hi, stall = lo + 1.0, sim.stall_after_s
                    if lo < stall < hi:
                        if t < stall:
                            hi = stall
                        else:
                            lo = stall
                    sim.lo, sim.hi, sim.sm = lo, hi, sm
                else:  # before the process's start (a clock stepped back): not kept
                    sim.lo, sim.hi = 1.0, 0.0
            used = _read_mem_file(sim.mem_file) if sim.mem_file else None
            if used is None:
                used = sim.profile.memory_at(t, sim.base_bytes)
            if used > room:
                used = room
            for index in sim.gpus:
                mem[index] += used
                util[index] += sm
            uses = tuple([GpuUse(uuids[index], used, sm) for index in sim.gpus])
            processes[pid] = list(uses)
            if sim.flat:
                sim.used, sim.uses = used, uses
        total, base = spec.memory_bytes, spec.base_memory_bytes
        readings = out.readings
        for i, uuid_ in enumerate(uuids):
            u = min(100.0, util[i])
            readings.append(GpuReading(uuid_, u, min(total, base + mem[i]), total, round(spec.power(u), 1)))
        out.errors, self._pending_errors = self._pending_errors, 0
        if self.health_nvml is not None:
            lost = self.health_nvml.lost(now)
            if lost:
                _leave_out(out, {uuids[i] for i in lost})
        return out

    def use_new_pids(self, news: NewPids) -> bool:
        """Find new processes with `news` (the process source's), when it looks at the same /proc.

        Its owner starts a round (NewPids.new_round) each poll, so /proc/loadavg is read, and /proc listed
        now and then, once for both. Returns whether it is used.
        """
        if news.proc != self._proc:
            return False
        self._news.close()
        self._news = news
        return True

    def close(self) -> None:
        """Forget the processes seen and close their pidfds."""
        for pid in list(self._known):
            self._forget(pid)
        if not self._news.shared:
            self._news.reset()

    # --- finding the processes ---------------------------------------------------------

    def _scan(self) -> None:
        known = self._known
        if not self._pidfds:
            self._news.force()  # no pidfds: only a listing tells that a process has exited
        new = self._news.poll()
        if self._news.listed:
            listing = self._news.listing or {}
            for pid in [p for p in known if p not in listing]:
                self._forget(pid)
            if new is None:
                new = listing.keys()
        for pid in new:
            got = self._probe(pid)
            if got is None:
                continue  # exited meanwhile, or a thread
            cur = known.get(pid)
            if cur is not None:
                if cur.start_ticks == got:
                    continue
                self._forget(pid)  # the pid was reused
            try:
                sim = self._inspect(pid, got)
            except ExecInProgress:
                self._news.again(pid)  # its variables are not there yet: read them at the next poll
                continue
            entry = known[pid] = _Known(got, sim)
            if sim is not None:
                self._played[pid] = sim
                if self._pidfds:
                    self._watch_exit(pid, entry)
        if self._by_pidfd:
            for fd, _ in self._exits.poll(0):
                self._forget(self._by_pidfd[fd])

    def _watch_exit(self, pid: int, entry: _Known) -> None:
        """Open a pidfd for a played process; checked against its start time, so it is that process's."""
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            self._pidfds = False  # no pidfds here (or no descriptors left): list /proc at every poll
            return
        if self._probe(pid) != entry.start_ticks:
            os.close(fd)
            self._forget(pid)  # gone, or reused meanwhile: a new pid is found as new
            return
        entry.pidfd = fd
        self._by_pidfd[fd] = pid
        self._exits.register(fd, select.POLLIN)

    def _forget(self, pid: int) -> None:
        self._played.pop(pid, None)
        entry = self._known.pop(pid, None)
        if entry is not None and entry.pidfd >= 0:
            self._exits.unregister(entry.pidfd)
            del self._by_pidfd[entry.pidfd]
            os.close(entry.pidfd)

    def _probe(self, pid: int) -> int | None:
        """The start ticks of a process, None when it is gone or is a thread."""
        try:
            with open(f"{self._proc}/{pid}/stat", "rb", buffering=0) as f:
                got = probe(f.read(4096))
        except OSError:
            return None
        return got[1] if got is not None else None

    def _inspect(self, pid: int, start_ticks: int) -> _SimProc | None:
        self.environ_reads += 1
        data = read_environ(self._proc, pid)
        if data is None:
            return None  # another user's process (agent not root), or gone: not ours to play
        try:
            spec = parse_sim_environ(data, run=self.run)
        except ValueError:
            self._pending_errors += 1
            return None
        if spec is None or (spec.node is not None and spec.node != self.node):
            return None
        profile = self.scenario.profile(spec.profile)
        if profile is None or any(not 0 <= i < len(self._gpus) for i in spec.gpus):
            self._pending_errors += 1  # counted once: the cache keeps the answer
            return None
        return _SimProc(
            start_time=self._boot_time + start_ticks / self._tick,
            gpus=tuple(dict.fromkeys(spec.gpus)),
            profile=profile,
            base_bytes=int(spec.base_mib * MiB) if spec.base_mib is not None else None,
            mem_file=spec.mem_file,
            seed=(pid << 32) ^ start_ticks,
            flat=profile.kind in _FLAT_KINDS and not spec.mem_file,
            stall_after_s=profile.stall_after_s if profile.kind == "stall" else float("inf"),
        )


def _leave_out(out: GpuPoll, lost: set[str]) -> None:
    """Lost GPUs read as NVML's do: no reading, their processes still listed on them without figures (a gap,
    not a freed GPU)."""
    out.readings[:] = [r for r in out.readings if r.uuid not in lost]
    out.stale.extend(sorted(lost))
    for pid, uses in out.processes.items():
        out.processes[pid] = [GpuUse(u.gpu_uuid) if u.gpu_uuid in lost else u for u in uses]


def _boot_time(proc_root: str) -> float:
    # The same origin psutil uses for create_time(), so start times agree with the process source.
    try:
        with open(f"{proc_root}/stat", "rb") as f:
            return parse_btime(f.read()) or 0.0
    except OSError:
        return 0.0


def _read_mem_file(path: str) -> int | None:
    """The number of bytes a process wrote to its memory file, or None.

    Opened non-blocking and read only if it is a regular file, so a FIFO or a device
    named there cannot hang or flood the agent.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = os.read(fd, _MEM_FILE_MAX).strip()
    except OSError:
        return None
    finally:
        os.close(fd)
    return int(text) if text.isdigit() else None


def open_sim_source(path: str | None, *, node: str | None = None, run: str | None = None) -> SimGpuSource:
    """Load a scenario file (the embedded default for None) and build the source.

    Args:
        path: a scenario TOML file, or None for `sim_default.toml` shipped with the package.
        node: the node name the GPU UUIDs derive from (default: the host name).
        run: the run token whose processes it plays (None: those without one).

    Returns:
        The simulated source.

    Raises:
        ConfigError: the file cannot be read or is malformed; one line naming it.
    """
    if path is None:
        text = resources.files(__package__).joinpath(DEFAULT_SCENARIO).read_text(encoding="utf-8")
        scenario = parse_scenario(text, f"<default {DEFAULT_SCENARIO}>")
    else:
        text = toml_file.read_text(path, f"scenario {path}", "pass an existing TOML file")
        scenario = parse_scenario(text, path)
    return SimGpuSource(scenario, node=node, run=run)
