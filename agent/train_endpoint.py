"""The agent's end of clusterwatch.train: a Unix datagram socket that training processes report to.

The socket is world-writable (mode 0666, in a 0755 directory the agent owns) because
training runs as users. Who sent a report is never taken from the report: the socket
has SO_PASSCRED, so the kernel attaches the sender's pid, uid and gid to every
datagram (SCM_CREDENTIALS), and a user cannot report for another user's process. (A
sender with CAP_SYS_ADMIN, i.e. root, can give another pid; root is trusted here.)

A reader thread empties the socket as datagrams come, so the kernel's small per-socket
queue (net.unix.max_dgram_qlen, often 10 datagrams) does not drop reports between two
polls of the agent loop; it parses each one into a `TrainingReport` and keeps it in a
bounded queue that the loop empties with `drain()`. When the queue is full the oldest
report goes (`overflowed`); a datagram that is too large, not a JSON object of the
documented shape, or holds a value the protobuf message cannot carry (a lone surrogate, a
number out of range) is dropped whole and counted (`rejected`), before the agent loop sees it.
A report carries its sender's start time, read from /proc/<pid>/stat on arrival, so the
collector can tell a reused pid apart; one from a process that has exited since keeps start
time 0.0.

One agent listens at a path: it holds PATH.lock while it does, a second agent refuses, and a
socket that goes away under a running agent (a cleanup script) is bound again at the next poll
(`check`); agent/train_socket.py says how a live socket is told from a stale one.

The datagram format is documented in clusterwatch/train.py.
"""
from __future__ import annotations

import collections
import json
import logging
import math
import os
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable

from clusterwatch.agent import train_socket
from clusterwatch.agent.provenance import process_start_time

from clusterwatch.errors import ClusterwatchError, ConfigError
from clusterwatch.model import AllocatorFigures, TrainingReport
from clusterwatch.procfs import read_boot_time
from clusterwatch.thread_names import name_os_thread
from clusterwatch.train import DEFAULT_SOCKET, MAX_DATAGRAM, MAX_GPUS, MAX_METRICS, MAX_NAME, MAX_TAG_VALUE
from clusterwatch.train_requests import MAX_REPLY

log = logging.getLogger(__name__)

_UCRED = struct.Struct("iII")  # struct ucred: pid_t pid; uid_t uid; gid_t gid
_CMSG_SPACE = socket.CMSG_SPACE(_UCRED.size)
_MAX_INT = 2**63 - 1
# sockaddr_un.sun_path is 108 bytes on Linux, its last the terminating NUL
MAX_SOCKET_PATH_BYTES = 107
# Reply addresses kept (one per reporting process); beyond it the longest silent goes.
MAX_ADDRESSES = 4096
# clusterwatch/train_requests.py reply_datagram's first bytes (json.dumps' spacing); a report is compact
_REPLY_PREFIX = b'{"v": 1, "reply": '


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and not -_MAX_INT <= value <= _MAX_INT:
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _text(value: object, limit: int, what: str, empty: bool = False) -> str:
    """A string the protobuf message can carry: str, at most `limit` characters, encodable as UTF-8.

    json.loads accepts lone surrogates ("\\ud800") that protobuf refuses to store; one such string
    reaching the poll made the whole poll fail, so it is refused here.
    """
    if not isinstance(value, str) or len(value) > limit or (not value and not empty):
        raise ValueError(f"{what} is not a string of {'0' if empty else '1'}-{limit} characters")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{what} is not valid Unicode (a lone surrogate)") from None
    return value


def _object(value: object, what: str) -> dict:
    if not isinstance(value, dict) or len(value) > MAX_METRICS:
        raise ValueError(f"{what} is not an object of at most {MAX_METRICS} entries")
    return value


_GPU_FIELDS = (("allocated", "allocated_bytes"), ("reserved", "reserved_bytes"),
               ("alloc_retries", "alloc_retries"), ("inactive_split", "inactive_split_bytes"))


def _count(value: object, what: str, limit: int = _MAX_INT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise ValueError(f"{what} is not an int from 0 to {limit}")
    return value


def _gpu_memory(value: object) -> list[AllocatorFigures]:
    """The allocator's figures ("gpu": [{index, uuid, allocated, reserved, alloc_retries, inactive_split}])."""
    if not isinstance(value, list) or len(value) > MAX_GPUS:
        raise ValueError(f"gpu is not a list of at most {MAX_GPUS} entries")
    out = []
    for entry in value:
        if not isinstance(entry, dict):
            raise ValueError("a gpu entry is not an object")
        index = entry.get("index")
        figures = {field: _count(entry[key], f"gpu {key}") for key, field in _GPU_FIELDS
                   if entry.get(key) is not None}
        out.append(AllocatorFigures(
            index=None if index is None else _count(index, "gpu index", 2**32 - 1),
            uuid=_text(entry.get("uuid", ""), MAX_NAME, "gpu uuid", empty=True), **figures))
    return out


def parse_datagram(data: bytes, pid: int, start_time: float, now: float) -> TrainingReport:
    """Turn one datagram into a report for the process the kernel named.

    Every field is checked against what the protobuf message (agent_pb2.TrainingSample) can carry
    and the documented bounds, so a report returned always converts (tests/train/test_train_fuzz.py).

    Args:
        data: the datagram.
        pid: the sender's pid, from SCM_CREDENTIALS (any "pid" inside is ignored).
        start_time: the sender's start time.
        now: the receive time (the sender's clock is not trusted).

    Returns:
        The report.

    Raises:
        ValueError: the datagram is not a version-1 object, or a field has the wrong type, is out
            of range or too long (a sender that validates as clusterwatch.train does never sends
            one). Nothing else: any bytes give a report or a ValueError.
    """
    if len(data) > MAX_DATAGRAM:
        raise ValueError("datagram too large")
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError("not JSON") from exc
    except RecursionError:  # "[[[[..." nested past the interpreter's limit
        raise ValueError("JSON nested too deep") from None
    if not isinstance(obj, dict) or type(obj.get("v")) is not int or obj["v"] != 1:
        raise ValueError("not a version-1 object")
    report = TrainingReport(time=now, pid=pid, start_time=start_time)
    step = obj.get("step")
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= _MAX_INT:
            raise ValueError("step is not a non-negative int")
        report.step = step
    for key in ("loss", "lr", "epoch"):
        if key in obj and obj[key] is not None:
            value = _number(obj[key])
            if value is None:
                raise ValueError(f"{key} is not a finite number")
            setattr(report, key, value)
    for name, raw in _object(obj.get("m", {}), "m").items():
        value = _number(raw)
        if value is None:
            raise ValueError("a metric is not a finite number")
        report.metrics[_text(name, MAX_NAME, "a metric name")] = value
    for name, value in _object(obj.get("tags", {}), "tags").items():
        report.tags[_text(name, MAX_NAME, "a tag name")] = _text(value, MAX_TAG_VALUE, "a tag value", empty=True)
    if obj.get("gpu") is not None:
        report.gpu_memory = _gpu_memory(obj["gpu"])
    return report


class TrainEndpoint:
    """Receives clusterwatch.train reports on a Unix datagram socket.

    Args:
        path: the socket's path (its directory is created 0755 when missing).
        max_queue: reports kept between two drains; beyond it the oldest go.
        proc: the /proc mount point (start times).
        clock: wall clock for receive times.
        start_time: pid → start time; the default reads /proc/<pid>/stat.

    Attributes:
        received: datagrams read from the socket.
        rejected: of those, malformed, oversized, or without the sender's credentials.
        overflowed: reports dropped because the queue was full.
        on_reply: called on the reader thread with (pid, datagram, cut) for each answer to a request
            (a datagram with the "reply" key, at most MAX_REPLY bytes read; `cut`: it was longer),
            pid from the kernel's credentials (agent/train_asks.py checks the rest).

    Requests go back from this socket to the address each process reports from (`send`): the
    address is kept per (pid, start time) from its latest report, so a process that never reported
    cannot be asked, and a pid reused since is not asked in the old one's name.
    """

    def __init__(self, path: str = DEFAULT_SOCKET, max_queue: int = 10000, proc: str = "/proc",
                 clock: Callable[[], float] = time.time,
                 start_time: Callable[[int], float] | None = None) -> None:
        self.path = path
        self.max_queue = max_queue
        self.received = 0
        self.rejected = 0
        self.overflowed = 0
        self._said_rejected = False
        self._clock = clock
        self._proc = proc
        self._start_time = start_time
        self._boot: float | None = None
        self._queue: collections.deque[TrainingReport] = collections.deque()
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._wake_r = self._wake_w = -1
        self._thread: threading.Thread | None = None
        self._lock_fd = -1  # PATH.lock, held while listening (agent/train_socket.py)
        self._bound: tuple[int, int] | None = None  # (device, inode) of the socket this endpoint bound
        self._said = ""  # what keeps the socket from being bound again, as last logged
        self._addresses: collections.OrderedDict[tuple[int, float], bytes | str] = collections.OrderedDict()
        self.on_reply: Callable[[int, bytes, bool], None] | None = None

    # -- life cycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Bind the socket and start the reader thread; returns at once.

        Raises:
            SocketTaken: another agent (or another program) listens at the path
                (agent/train_socket.py); the path is left as it was.
            ConfigError: the socket's directory is not safe (owned by another user, or
                writable by others), something other than a socket is at the path, or the
                socket cannot be bound.
        """
        if self._thread is not None:
            return
        size = len(os.fsencode(self.path))
        if size > MAX_SOCKET_PATH_BYTES:
            # bind() would fail with an OSError that has no errno (its strerror None)
            raise ConfigError(f"the training socket path {self.path} is {size} bytes; a Unix socket path is at "
                              f"most {MAX_SOCKET_PATH_BYTES}: pass --train-socket (CLUSTERWATCH_TRAIN_SOCKET) "
                              "with a shorter path, e.g. /run/clusterwatch/train.sock")
        self._prepare_dir(os.path.dirname(os.path.abspath(self.path)))
        self._lock_fd = train_socket.claim(self.path)  # a second agent refuses here, the path untouched
        try:
            train_socket.make_way(self.path, log)
            self._sock = self._bind()
        except BaseException:
            train_socket.release(self.path, self._lock_fd)
            self._lock_fd = -1
            raise
        if self._start_time is None:
            self._boot = read_boot_time(self._proc)
        self._start_reader()

    def _bind(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(self.path)
            os.chmod(self.path, 0o666)  # training processes run as users
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            except OSError:
                pass
            sock.setblocking(False)
            self._bound = train_socket.identity(self.path)
        except OSError as exc:
            sock.close()
            raise ConfigError(f"cannot bind the training socket {self.path}: {exc.strerror or exc}") from None
        return sock

    def _start_reader(self) -> None:
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._reader, name="clusterwatch-train-endpoint",
                                        daemon=True)
        self._thread.start()

    def _stop_reader(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            os.write(self._wake_w, b"x")
            thread.join(5.0)
            os.close(self._wake_r)
            os.close(self._wake_w)

    def check(self) -> None:
        """Bind the socket again when its path no longer names it; the agent loop calls it every poll.

        A cleanup script (or a hand) may remove the socket, its lock file or their folder: training
        processes then get ENOENT and their reports are lost until the path names a socket this agent
        reads. One line each time it is bound again; what keeps it from being bound (another agent took
        the path, something else is there) is said once, and again only when it changes.
        """
        if self._sock is None:
            return
        if train_socket.identity(self.path) == self._bound and train_socket.holds(self.path, self._lock_fd):
            return
        try:
            self._rebind()
        except (ClusterwatchError, OSError) as exc:
            said = str(exc) if isinstance(exc, ClusterwatchError) else (exc.strerror or str(exc))
            if said != self._said:
                self._said = said
                log.warning("the training socket %s is gone and this agent cannot bind it again: %s; training "
                            "processes' reports are lost until it can (tried every poll)", self.path, said)
            return
        self._said = ""

    def _rebind(self) -> None:
        self._prepare_dir(os.path.dirname(os.path.abspath(self.path)))
        if not train_socket.holds(self.path, self._lock_fd):
            fd = train_socket.claim(self.path)  # SocketTaken when another agent holds it now
            os.close(self._lock_fd)
            self._lock_fd = fd
        if train_socket.identity(self.path) == self._bound:
            return  # only the lock file had gone
        train_socket.make_way(self.path, log)
        sock = self._bind()
        self._stop_reader()
        old, self._sock = self._sock, sock
        if old is not None:
            try:  # what arrived before the path went: the reports still count
                self._read_batch(old)
            finally:
                old.close()
        self._start_reader()
        log.warning("the training socket %s was removed or replaced; bound it again: training processes' "
                    "reports reach this agent again", self.path)

    @staticmethod
    def _prepare_dir(directory: str) -> None:
        try:
            os.makedirs(directory, mode=0o755, exist_ok=True)
            st = os.stat(directory)
        except OSError as exc:
            raise ConfigError(f"cannot create {directory} for the training socket: {exc.strerror}") from None
        # a directory another user controls would let them swap the socket for their own
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise ConfigError(f"{directory} must belong to uid {os.geteuid()} and not be writable "
                              "by others; fix its owner/mode or choose another socket path")
        if st.st_mode & 0o005 != 0o005:
            os.chmod(directory, 0o755)

    def close(self) -> None:
        """Stop the reader, close the socket, remove it (when its path is still ours) and let go of the lock.
        Reports not drained are kept."""
        self._stop_reader()
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            # another agent's socket may be there now: only this one's own goes
            if self._bound is not None and train_socket.identity(self.path) == self._bound:
                try:
                    os.unlink(self.path)
                except OSError:
                    pass
            self._bound = None
        if self._lock_fd >= 0:
            train_socket.release(self.path, self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> TrainEndpoint:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the agent loop's side ------------------------------------------------------------

    def drain(self) -> list[TrainingReport]:
        """Every report received since the last drain, oldest first."""
        with self._lock:
            out = list(self._queue)
            self._queue.clear()
        return out

    def reply_address(self, pid: int, start_time: float) -> bytes | str | None:
        """The address process (pid, start time) last reported from; None when it never reported."""
        with self._lock:
            for (p, start), addr in self._addresses.items():
                if p == pid and abs(start - start_time) <= 0.05:
                    return addr
        return None

    def send(self, pid: int, start_time: float, data: bytes) -> str:
        """Send one request datagram to a process; "" when the kernel took it, else why not."""
        addr = self.reply_address(pid, start_time)
        if addr is None:
            return "the process never reported through clusterwatch.train (or not since the agent started)"
        sock = self._sock
        if sock is None:
            return "the agent's training socket is closed"
        try:
            sock.sendto(data, addr)
        except OSError as exc:
            return f"the process's socket did not take the request ({exc.strerror or exc})"
        return ""

    def _remember(self, pid: int, start_time: float, addr: object) -> None:
        if not start_time or not isinstance(addr, (bytes, str)) or not addr:
            return  # an unbound sender (or an unknown start time) cannot be asked back
        key = (pid, start_time)
        with self._lock:
            if self._addresses.get(key) != addr:
                self._addresses[key] = addr
            self._addresses.move_to_end(key)
            while len(self._addresses) > MAX_ADDRESSES:
                self._addresses.popitem(last=False)

    # -- the reader thread ----------------------------------------------------------------

    def _reader(self) -> None:
        name_os_thread("cw-train")
        assert self._sock is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self._sock, selectors.EVENT_READ, "sock")
            sel.register(self._wake_r, selectors.EVENT_READ, "wake")
            while True:
                for key, _ in sel.select():
                    if key.data == "wake":
                        return
                try:
                    self._read_batch()
                except Exception:  # never let the reader die: reports would stop silently
                    log.exception("training endpoint: reading a batch failed")

    def _read_batch(self, sock: socket.socket | None = None) -> None:
        sock = sock or self._sock
        assert sock is not None
        starts: dict[int, float | None] = {}  # one /proc read per sender per batch
        for _ in range(1024):
            try:
                # answers to requests are up to MAX_REPLY bytes; reports at most MAX_DATAGRAM
                data, ancdata, flags, addr = sock.recvmsg(MAX_REPLY + 1, _CMSG_SPACE)
            except (BlockingIOError, InterruptedError):
                return
            self.received += 1
            if data.startswith(_REPLY_PREFIX) and self.on_reply is not None:
                pid = self._sender(ancdata, flags & socket.MSG_CTRUNC)
                if pid is None:
                    self.rejected += 1
                else:
                    self.on_reply(pid, data, bool(flags & socket.MSG_TRUNC) or len(data) > MAX_REPLY)
                continue
            report = self._parse(data, ancdata, flags, starts)
            if report is None:
                self.rejected += 1
                continue
            self._remember(report.pid, report.start_time, addr)
            with self._lock:
                if len(self._queue) >= self.max_queue:
                    self._queue.popleft()
                    self.overflowed += 1
                self._queue.append(report)

    def _parse(self, data: bytes, ancdata: list, flags: int,
               starts: dict[int, float | None]) -> TrainingReport | None:
        if flags & socket.MSG_TRUNC or len(data) > MAX_DATAGRAM:
            return None
        pid = self._sender(ancdata, flags & socket.MSG_CTRUNC)
        if pid is None:
            return None
        if pid not in starts:
            starts[pid] = self._lookup_start(pid)
        # A process that exited right after its last report is gone by now; that last step still
        # counts. Its start time is unknown (0.0), which the collector reads as "not known".
        start = starts[pid] or 0.0
        try:
            return parse_datagram(data, pid, start, self._clock())
        except ValueError as exc:
            if not self._said_rejected:  # one line for the first; the rest are counted (`rejected`)
                self._said_rejected = True
                log.warning("training endpoint: dropped a report from pid %d: %s; clusterwatch.train sends "
                            "valid ones, so check what else writes to %s (further drops are counted only)",
                            pid, exc, self.path)
            return None

    @staticmethod
    def _sender(ancdata: list, ctrunc: int) -> int | None:
        """The sender's pid from the kernel's credentials; None without them."""
        if ctrunc:
            return None
        pid = None
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(payload) >= _UCRED.size:
                pid, _uid, _gid = _UCRED.unpack_from(payload)
        return pid if pid is not None and pid > 0 else None

    def _lookup_start(self, pid: int) -> float | None:
        try:
            if self._start_time is not None:
                return self._start_time(pid)
            return process_start_time(pid, self._proc, self._boot)
        except (OSError, ValueError):
            return None
