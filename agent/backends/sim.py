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

Curves run from each process's start time; noise is seeded by (pid, start time), so a
poll at a given time always reads the same. Device readings derive from the processes on
each GPU: memory = base + their memory, utilisation = their sum (at most 100 %), power
linear in utilisation. The scenario format is in `sim_scenario.py`.
"""
from __future__ import annotations

import os
import socket
import stat
import uuid
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from clusterwatch.agent.backends.gpu import GpuPoll
from clusterwatch.agent.backends.sim_scenario import MiB, Profile, Scenario, parse_scenario

from clusterwatch.errors import ConfigError
from clusterwatch.model import GpuInfo, GpuReading, GpuUse

__all__ = ["SimGpuSource", "open_sim_source", "SimSpec", "parse_sim_environ", "DEFAULT_SCENARIO"]

DEFAULT_SCENARIO = "sim_default.toml"
ENV_GPU = b"CLUSTERWATCH_SIM_GPU"
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


def parse_sim_environ(data: bytes) -> SimSpec | None:
    """Read the CLUSTERWATCH_SIM_* variables out of a `/proc/<pid>/environ` text.

    Args:
        data: the NUL-separated environment.

    Returns:
        The spec, or None when the process does not use a simulated GPU.

    Raises:
        ValueError: CLUSTERWATCH_SIM_GPU or CLUSTERWATCH_SIM_GPU_BASE_MB is not a number.
    """
    if ENV_GPU not in data:  # most processes: no split, no decode
        return None
    env: dict[str, str] = {}
    for item in data.split(b"\0"):
        if item.startswith(b"CLUSTERWATCH_SIM_"):
            key, _, value = item.partition(b"=")
            env[key.decode()] = value.decode(errors="replace")
    gpu = env.get("CLUSTERWATCH_SIM_GPU", "").strip()
    if not gpu:
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
    """A host process as last seen: its /proc inode tells us cheaply if the pid was reused."""

    inode: int
    start_ticks: int
    sim: _SimProc | None


@dataclass(frozen=True, slots=True)
class _SimProc:
    start_time: float
    gpus: tuple[int, ...]
    profile: Profile
    base_bytes: int | None
    mem_file: str | None
    seed: int


class SimGpuSource:
    """Plays a scenario for the processes on this host that opt in through their environment.

    Args:
        scenario: the parsed scenario.
        node: this source's node name: the GPU UUIDs derive from it (two simulated
            nodes on one host must not share UUIDs), and a process that names a node in
            CLUSTERWATCH_SIM_NODE is played only by that node's source. Default: the
            host name.
        proc_root: where /proc is.
    """

    name = "sim"

    def __init__(self, scenario: Scenario, *, node: str | None = None, proc_root: str = "/proc") -> None:
        self.scenario = scenario
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
        self._known: dict[int, _Known] = {}
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
        out = GpuPoll()
        for pid, known in self._known.items():
            sim = known.sim
            if sim is None:
                continue
            t = now - sim.start_time
            used = _read_mem_file(sim.mem_file) if sim.mem_file else None
            if used is None:
                used = sim.profile.memory_at(t, sim.base_bytes)
            used = min(used, spec.memory_bytes - spec.base_memory_bytes)
            sm = sim.profile.utilization_at(t, sim.seed)
            uses = []
            for index in sim.gpus:
                mem[index] += used
                util[index] += sm
                uses.append(GpuUse(self._gpus[index].uuid, used_memory_bytes=used, sm_utilization=sm))
            out.processes[pid] = uses
        for info in self._gpus:
            i = info.index
            u = min(100.0, util[i])
            out.readings.append(
                GpuReading(
                    uuid=info.uuid,
                    utilization=u,
                    memory_used_bytes=min(spec.memory_bytes, spec.base_memory_bytes + mem[i]),
                    memory_total_bytes=spec.memory_bytes,
                    power_watts=round(spec.power(u), 1),
                )
            )
        out.errors, self._pending_errors = self._pending_errors, 0
        return out

    def close(self) -> None:
        """Forget the processes seen; nothing else is held."""
        self._known.clear()

    # --- finding the processes ---------------------------------------------------------

    def _scan(self) -> None:
        known = self._known
        fresh: dict[int, _Known] = {}
        try:
            entries = os.scandir(self._proc)
        except OSError:
            self._pending_errors += 1
            return
        with entries:
            for entry in entries:
                name = entry.name
                if not name.isdigit():
                    continue
                pid = int(name)
                inode = entry.inode()  # from getdents: no extra system call
                cur = known.get(pid)
                if cur is not None and cur.inode == inode:
                    fresh[pid] = cur
                    continue
                # New to us, or its /proc entry was rebuilt: the start time says which.
                start = self._start_ticks(pid)
                if start is None:
                    continue  # exited meanwhile
                if cur is not None and cur.start_ticks == start:
                    cur.inode = inode
                    fresh[pid] = cur
                    continue
                fresh[pid] = _Known(inode, start, self._inspect(pid, start))
        self._known = fresh

    def _start_ticks(self, pid: int) -> int | None:
        try:
            with open(f"{self._proc}/{pid}/stat", "rb") as f:
                data = f.read()
            # comm may hold spaces and parentheses: the fields start after the last ')'.
            return int(data[data.rindex(b")") + 2 :].split()[19])
        except (OSError, ValueError, IndexError):
            return None

    def _inspect(self, pid: int, start_ticks: int) -> _SimProc | None:
        self.environ_reads += 1
        try:
            with open(f"{self._proc}/{pid}/environ", "rb") as f:
                data = f.read()
        except OSError:
            return None  # another user's process (agent not root), or gone: not ours to play
        try:
            spec = parse_sim_environ(data)
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
        )


def _boot_time(proc_root: str) -> float:
    # The same origin psutil uses for create_time(), so start times agree with the process source.
    try:
        with open(f"{proc_root}/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except OSError:
        pass
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


def open_sim_source(path: str | None, *, node: str | None = None) -> SimGpuSource:
    """Load a scenario file (the embedded default for None) and build the source.

    Args:
        path: a scenario TOML file, or None for `sim_default.toml` shipped with the package.
        node: the node name the GPU UUIDs derive from (default: the host name).

    Returns:
        The simulated source.

    Raises:
        ConfigError: the file cannot be read or is malformed; one line naming it.
    """
    if path is None:
        text = resources.files(__package__).joinpath(DEFAULT_SCENARIO).read_text(encoding="utf-8")
        scenario = parse_scenario(text, f"<default {DEFAULT_SCENARIO}>")
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ConfigError(
                f"scenario {path}: cannot read it ({reason}); pass an existing TOML file"
            ) from None
        scenario = parse_scenario(text, path)
    return SimGpuSource(scenario, node=node)
