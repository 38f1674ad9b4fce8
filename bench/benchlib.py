"""Shared pieces of the bench scripts: tables, medians, child processes, a collector, fake batches.

Everything here runs on loopback only, and every process started is tracked by its pid
and stopped by it (never by name). Not imported by clusterwatch itself.
"""
from __future__ import annotations

import json
import os
import random
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from waiting import wait_for

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
CLI = [PYTHON, "-m", "clusterwatch.cli.main"]
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
MiB = 1024 * 1024
GiB = 1024 * MiB


# -- output -------------------------------------------------------------------------------------

def median(values) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def spread(values) -> str:
    """min–max of a list of figures, for the 'runs' column."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return f"{min(values):.3g}–{max(values):.3g}"


def table(title: str, header: list[str], rows: list[list], notes: list[str] = ()) -> str:
    """A plain-text table: a title line, aligned columns, notes below."""
    cells = [[str(c) for c in header]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [title, ""]
    for n, row in enumerate(cells):
        pairs = enumerate(zip(row, widths, strict=True))
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    if notes:
        lines.append("")
        lines.extend(f"  {note}" for note in notes)
    return "\n".join(lines) + "\n"


def _fmt(v) -> str:
    if isinstance(v, float):
        if v != v:
            return "-"
        if abs(v) >= 100:
            return f"{v:,.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.3g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


# -- processes ----------------------------------------------------------------------------------

def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process (its threads included) in seconds, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    rest = data[data.rindex(b")") + 2:].split()
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


def threads_cpu_by_name(pid: int) -> dict[str, float]:
    """CPU seconds of a process's live threads by thread name (their comm), to the nanosecond, from
    /proc/<pid>/task/*/schedstat: for a long-lived process whose threads live as long as it does, a far
    finer clock than proc_cpu_s's 10 ms ticks."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                ns = int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
            continue
        out[name] = out.get(name, 0.0) + ns / 1e9
    return out


def threads_cpu_s(pid: int) -> float:
    """CPU seconds of a process's live threads (see threads_cpu_by_name)."""
    return sum(threads_cpu_by_name(pid).values())


def proc_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Children:
    """Processes this script started, stopped by pid (TERM, then KILL) when the block ends."""

    def __init__(self) -> None:
        self.popens: list[subprocess.Popen] = []

    def start(self, args, **kw) -> subprocess.Popen:
        kw.setdefault("stdin", subprocess.DEVNULL)
        p = subprocess.Popen(args, **kw)
        self.popens.append(p)
        return p

    def stop(self, p: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if p.poll() is None:
            try:
                p.send_signal(sig)
            except ProcessLookupError:
                pass
        try:
            return p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            return p.wait()

    def stop_all(self) -> None:
        for p in reversed(self.popens):
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for p in reversed(self.popens):
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.popens.clear()

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()


def env_with_repo() -> dict:
    env = dict(os.environ)
    env.pop("CLUSTERWATCH_COLLECTOR", None)
    return env


class CollectorProc:
    """A real `clusterwatch collector` process on free loopback ports, with a temporary store."""

    def __init__(self, children: Children, tmp: str, *extra: str, name: str = "collector") -> None:
        self.ports_file = os.path.join(tmp, f"{name}-ports.json")
        self.log_path = os.path.join(tmp, f"{name}.log")
        self.log = open(self.log_path, "ab")
        self.children = children
        self.popen = children.start(
            [*CLI, "collector", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
             "--db", os.path.join(tmp, f"{name}.db"), "--ports-file", self.ports_file,
             # a benchmark measures, it does not depend on this host's munged (a test that wants munge says so);
             # its agents are the bench's own clients, which prove nothing: their streams are taken as they were
             *([] if "--query-auth" in extra else ["--query-auth", "none"]),
             *([] if any(a in extra for a in ("--agent-auth", "--token")) else ["--agent-auth", "none"]), *extra],
            stdout=self.log, stderr=subprocess.STDOUT, env=env_with_repo(),
        )
        wait_for(lambda: os.path.exists(self.ports_file) or self.popen.poll() is not None, timeout=30.0,
                 interval=0.05, what="collector ports")
        if self.popen.poll() is not None:
            raise RuntimeError(f"collector exited: {Path(self.log_path).read_text(errors='replace')[-2000:]}")
        with open(self.ports_file) as f:
            ports = json.load(f)
        self.grpc_port, self.metrics_port = ports["grpc"], ports["metrics"]

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=30) as r:
            return r.read().decode()

    def stop(self) -> int:
        rc = self.children.stop(self.popen)
        self.log.close()
        return rc


def metric_value(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rpartition(" ")[2])
    return None


def tmpdir(prefix: str) -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix=prefix)


# -- realistic batches --------------------------------------------------------------------------

def gpu_uuid(node: str, index: int) -> str:
    r = random.Random(f"{node}/{index}")
    h = "%032x" % r.getrandbits(128)
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class NodeSim:
    """One simulated node: 8 GPUs and 64 processes (8 ranks, each with 7 DataLoader workers).

    Field values are what a training node reports: python processes, RSS of a few GiB,
    tens of threads, GPU memory of tens of GiB on the ranks, slowly varying.
    """

    def __init__(self, node: str, job_id: str, *, ranks: int = 8, workers: int = 7, first_rank: int = 0,
                 user: str = "alice", uid: int = 1000, start: float | None = None) -> None:
        from clusterwatch.v1 import agent_pb2

        self.pb = agent_pb2
        self.node = node
        self.job_id = job_id
        self.boot_id = os.urandom(16).hex()
        self.seq = 0
        self.rng = random.Random(node)
        start = start if start is not None else time.time() - 3600
        self.gpus = [gpu_uuid(node, i) for i in range(8)]
        self.procs = []  # (pid, ppid, start_time, rank, local_rank, gpu index or None, mapped_by)
        pid = 20000 + self.rng.randrange(10000)
        for r in range(ranks):
            main = pid
            self.procs.append((main, 1, start + r * 0.01, first_rank + r, r, r % 8, "environ"))
            pid += 1
            for _ in range(workers):
                self.procs.append((pid, main, start + 5 + r * 0.01, first_rank + r, r, None, "tree"))
                pid += 1
        self.user, self.uid = user, uid

    def hello(self):
        pb = self.pb
        h = pb.Hello(node=self.node, boot_id=self.boot_id, agent_version="bench", interval_s=1.0,
                     gpu_source="sim", sent_at=time.time(), node_memory_total_bytes=2 * 1024 * GiB)
        for i, u in enumerate(self.gpus):
            h.gpus.add(uuid=u, index=i, name="NVIDIA H100 80GB HBM3", memory_total_bytes=80 * GiB)
        return pb.AgentMessage(hello=h)

    def batch(self, now: float | None = None, polls: int = 1, interval: float = 1.0):
        """The next numbered batch, as an AgentMessage: `polls` polls `interval` apart, the last at `now`."""
        from clusterwatch.wire import processes_to_table

        pb = self.pb
        now = time.time() if now is None else now
        self.seq += 1
        b = pb.Batch(seq=self.seq, sent_at=now)
        samples = []
        for k in range(polls):
            t = now - (polls - 1 - k) * interval
            samples.extend(self._poll(t))
            self._gpus(b, t)
        processes_to_table(samples, b.processes)
        b.counters.samples_sent = self.seq * len(self.procs) * polls
        return pb.AgentMessage(batch=b)

    def _poll(self, now: float) -> list:
        from clusterwatch.model import GpuUse, ProcessSample

        rng = self.rng
        samples = []
        for pid, ppid, start, rank, local_rank, gpu, how in self.procs:
            uses = ()
            if gpu is not None:
                uses = (GpuUse(self.gpus[gpu], 60 * GiB + rng.randrange(256 * MiB), round(rng.uniform(80, 99), 1)),)
            samples.append(ProcessSample(
                time=now, node=self.node, pid=pid, start_time=start, ppid=ppid, uid=self.uid, user=self.user,
                command="python" if gpu is not None else "pt_data_worker", job_id=self.job_id, rank=rank,
                local_rank=local_rank, step_id="0", mapped_by=how,
                cpu_percent=round(rng.uniform(95, 180) if gpu is not None else rng.uniform(5, 60), 1),
                rss_bytes=(6 * GiB if gpu is not None else 900 * MiB) + rng.randrange(64 * MiB),
                threads=48 if gpu is not None else 4, open_fds=180 if gpu is not None else 40, gpus=uses))
        return samples

    def _gpus(self, b, now: float) -> None:
        rng = self.rng
        for u in self.gpus:
            b.gpus.add(time=now, uuid=u, utilization=round(rng.uniform(85, 100), 1),
                       memory_used_bytes=61 * GiB + rng.randrange(256 * MiB), memory_total_bytes=80 * GiB,
                       power_watts=round(rng.uniform(550, 700), 1))

    @property
    def samples_per_batch(self) -> int:
        return len(self.procs)


def collector_server_core(tmp: str):
    """The CollectorCore exactly as `clusterwatch collector` wires it (rules included, if wired), not started.

    Returns (server, core, rules_note).
    """
    from clusterwatch.collector.config import CollectorConfig
    from clusterwatch.collector.service import CollectorServer

    config = CollectorConfig(listen="127.0.0.1:0", metrics_listen=None, db_path=os.path.join(tmp, "bench.db"))
    server = CollectorServer(config)
    return server, server.core, rules_note(server)


def rules_note(server) -> str:
    """Whether the rules engine runs on the ingest path (as wired at the time of the run)."""
    hooks = [type(listener).__name__ for listener in server.core.listeners]
    if hooks:
        return f"rules ON: CollectorCore listeners = {', '.join(hooks)}"
    return "rules OFF: CollectorCore has no listener (the rules are not on the ingest path)"


def fix_env_pythonpath() -> None:
    """Make `clusterwatch` importable when run from a checkout without an install."""
    try:
        import clusterwatch  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(REPO))


# -- batches as bytes, cheap to send many of -----------------------------------------------------

_SENTINEL = 1234567890.0625  # a poll time no real batch carries; its 8 bytes are replaced per batch


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


class BatchBytes:
    """Serialised AgentMessage batches of one node, built from a few templates.

    Each template is a real NodeSim batch of `polls` polls serialised with sentinel times;
    a batch to send is a template with each sentinel's bytes replaced by its poll's time
    (every sample's `time`, every GPU sample's `time`, `sent_at`), followed by a second
    `batch` field holding only `seq`: protobuf merges the two, so the collector parses one
    ordinary Batch. About 10 µs a batch instead of milliseconds for building it in Python.

    As the agent does, the first batch holds one poll (the agent sends its first poll at once);
    the polls of the next ones follow it, `interval` apart.

    Args:
        sim: the node.
        variants: templates to cycle through (the readings differ between them).
        polls: polls a batch joins, `interval` apart (what the agent sends with its send interval).
        realtime: the last poll of a batch is at the wall clock; otherwise batches follow one
            another on their own timeline (polls × interval apart), however fast they are sent.
    """

    def __init__(self, sim: NodeSim, variants: int = 4, polls: int = 1, interval: float = 1.0,
                 realtime: bool = True) -> None:
        self.sim = sim
        self.polls, self.interval, self.realtime = polls, interval, realtime
        self.offsets = [(polls - 1 - k) * interval for k in range(polls)]
        self.templates = []
        for _ in range(variants):
            msg = sim.batch(now=_SENTINEL, polls=polls, interval=interval)
            msg.batch.ClearField("seq")
            self.templates.append(msg.SerializeToString())
        first = sim.batch(now=_SENTINEL, polls=1)
        first.batch.ClearField("seq")
        self.first = first.SerializeToString()
        sim.seq = 0
        self.seq = 0
        self.t = time.time() - 3600.0  # the own timeline starts an hour ago
        self.last_samples = 0  # process samples in the batch next() returned last

    def next(self, now: float | None = None) -> tuple[int, bytes]:
        self.seq += 1
        first = self.seq == 1
        if now is None:
            if self.realtime:
                now = time.time()
            else:
                self.t += self.interval if first else self.polls * self.interval
                now = self.t
        body = self.first if first else self.templates[self.seq % len(self.templates)]
        self.last_samples = self.sim.samples_per_batch * (1 if first else self.polls)
        for off in [0.0] if first else self.offsets:
            body = body.replace(struct.pack("<d", _SENTINEL - off), struct.pack("<d", now - off))
        inner = b"\x08" + _varint(self.seq)
        return self.seq, body + b"\x12" + _varint(len(inner)) + inner

    def hello(self) -> bytes:
        return self.sim.hello().SerializeToString()


# -- simulated agent streams over gRPC (grpc.aio) -------------------------------------------------

STREAM_METHOD = "/clusterwatch.v1.Ingest/Stream"


def _ident(b: bytes) -> bytes:
    return b


class StreamResult:
    """What one simulated agent stream sent and got back."""

    __slots__ = ("sent", "acked", "samples_sent", "samples_acked", "delays", "sent_times", "error")

    def __init__(self) -> None:
        self.sent = self.acked = self.samples_sent = self.samples_acked = 0
        self.delays: list[float] = []  # seconds from sending a batch to its ack
        self.sent_times: list[float] = []  # when each of those batches was sent (time.monotonic())
        self.error = ""


async def agent_stream(channel, bb: BatchBytes, result: StreamResult, *, batches: int | None = None,
                       interval: float = 0.0, until: float | None = None, window: int = 16,
                       phase: float = 0.0, drain_timeout: float = 30.0) -> None:
    """One simulated agent: a hello, then numbered batches, each answered by an ack.

    Args:
        channel: a grpc.aio channel to the collector (or to any Ingest server).
        bb: the node's batches.
        batches: how many to send (or None: until `until`).
        interval: seconds between batches (0: as fast as the window allows).
        until: time.monotonic() after which no batch is sent.
        window: at most this many unacknowledged batches in flight.
        phase: seconds to wait before the first batch (spreads nodes over the interval).
        drain_timeout: after the last batch, how long to wait for the outstanding acks.
    """
    import asyncio

    from clusterwatch.v1 import agent_pb2

    method = channel.stream_stream(STREAM_METHOD, request_serializer=_ident,
                                   response_deserializer=agent_pb2.CollectorMessage.FromString)
    sent_at: dict[int, float] = {}
    slots = asyncio.Semaphore(window)
    drained = asyncio.Event()  # set when every batch sent is acknowledged, once sending is over
    sending = [True]
    mono = time.monotonic

    async def requests():
        yield bb.hello()
        if phase:
            await asyncio.sleep(phase)
        next_at = mono()
        n = 0
        while (batches is None or n < batches) and (until is None or mono() < until):
            await slots.acquire()
            seq, data = bb.next()
            sent_at[seq] = (mono(), bb.last_samples)
            result.sent += 1
            result.samples_sent += bb.last_samples
            n += 1
            yield data
            if interval:
                next_at += interval
                delay = next_at - mono()
                if delay > 0:
                    await asyncio.sleep(delay)
        # An agent keeps its stream open: half-closing here would end the call before the last acks.
        sending[0] = False
        if not sent_at:
            drained.set()
        try:
            await asyncio.wait_for(drained.wait(), drain_timeout)
        except asyncio.TimeoutError:
            pass

    call = method(requests())
    try:
        async for msg in call:
            if msg.WhichOneof("body") != "ack":
                continue
            got = sent_at.pop(msg.ack.seq, None)
            if got is None:
                continue
            result.delays.append(mono() - got[0])
            result.sent_times.append(got[0])
            result.acked += 1
            result.samples_acked += got[1]
            slots.release()
            if not sending[0] and not sent_at:
                drained.set()
    except Exception as exc:  # report, do not hide: a stream that failed shows in the table
        result.error = f"{type(exc).__name__}: {str(exc)[:200]}"


def aio_channel(address: str):
    import grpc

    return grpc.aio.insecure_channel(address, options=[
        ("grpc.max_send_message_length", 64 * MiB), ("grpc.max_receive_message_length", 64 * MiB),
        ("grpc.use_local_subchannel_pool", 1),
    ])


def feed_job(address: str, job_id: str, nodes: int = 8, ranks: int = 8, batches: int = 3) -> int:
    """Send a job of `nodes` × `ranks` (each rank with 7 workers) to a collector; return samples acked."""
    import asyncio

    async def main() -> int:
        total = 0
        sims = [NodeSim(f"{job_id}-node{n + 1}", job_id, ranks=ranks, first_rank=n * ranks) for n in range(nodes)]
        results = [StreamResult() for _ in sims]
        channels = [aio_channel(address) for _ in sims]
        await asyncio.gather(*(agent_stream(ch, BatchBytes(s), r, batches=batches, interval=0.2)
                               for ch, s, r in zip(channels, sims, results, strict=True)))
        for ch in channels:
            await ch.close()
        for r in results:
            if r.error:
                raise RuntimeError(r.error)
            total += r.samples_acked
        return total

    return asyncio.run(main())
