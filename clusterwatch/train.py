"""Report training progress to the node's clusterwatch agent. Standard library only.

    from clusterwatch import train
    train.tags(experiment="lr-sweep", dataset="c4")
    for step, batch in enumerate(loader):
        loss = ...
        train.report(step=step, loss=loss.item(), lr=sched.get_last_lr()[0])

Each call sends one small JSON datagram over a Unix datagram socket to the agent
(path from `CLUSTERWATCH_TRAIN_SOCKET`, default `/run/clusterwatch/train.sock`). It
never blocks and never raises: when the agent is absent, or its queue is full, the
report is dropped and counted (`dropped()`); `sent()` counts the ones the kernel
took. After the agent was found absent, reports are dropped without a system call
for one second, so an absent agent costs even less than a present one. Reports
that cannot reach the agent (no socket, nobody reading it, no permission; not a
full queue) are said once on this process's stderr, in one line with the reason:
at once when the agent had been reached before (its socket went away), after 10 s
of failing when it never was (an agent that starts after the training process, as
under `clusterwatch run`, is not called missing). The collector sees no new step
while reports do not arrive; the line tells the user that training went on. Lost
reports are not resent: each carries the current step, so the first that arrives
again moves it.

Values: `step` must be an int; `loss`, `lr`, `epoch` and metric values finite
numbers (int, float, or anything with `__float__` such as a NumPy scalar; bools are
not numbers here). A value that is not, or a metric name or tag that is not a short
string encodable as UTF-8, is left out of the report and counted (`invalid()`); the
rest of the report is still sent (the agent drops a datagram with any invalid field
whole). Pass Python numbers: `float()` of a GPU tensor waits for the GPU.

The agent learns the sender's pid and uid from the kernel (SCM_CREDENTIALS), not
from the datagram, so a report is always attributed to the process that sent it.

The allocator's view of GPU memory: when PyTorch is already imported and has initialised
CUDA in this process, a report carries, at most every 5 s, the caching allocator's figures
for each device the process uses (`torch.cuda.memory_stats`: allocated, reserved, allocation
retries, inactive split bytes). NVML sees only reserved memory plus the CUDA context, which
grows in steps and never shrinks; allocated memory is what tells a leak from the cache.
torch is never imported here and the GPU never synchronised (the allocator's counters are
host-side). Other frameworks pass `gpu_allocated_bytes=` and `gpu_reserved_bytes=`.

Datagram format (version 1), a JSON object with optional keys:
    {"v": 1, "step": int, "loss": float, "lr": float, "epoch": float,
     "m": {name: number, ...}, "tags": {name: string, ...},
     "gpu": [{"index": int, "uuid": str, "allocated": int, "reserved": int,
              "alloc_retries": int, "inactive_split": int}, ...]}
`gpu` entries: every key optional; no `index` means the process's current device (figures
a framework passed itself); `uuid` is torch's device UUID (without NVML's "GPU-" prefix in
some releases); an agent that predates `gpu` ignores it.

Requests back: the socket is bound to an autobound abstract address, so the agent can ask this
process to act (`on_request("checkpoint", handler)`; handlers run inside the next `report()`) or
to show its threads' stacks (answered by a listener thread even when the main thread is stuck).
clusterwatch/train_requests.py describes the channel and who may use it.

Fork-safe: a child (a DataLoader worker) gets its own socket and zeroed counters.
Thread-safe: a datagram is sent whole or not at all; counters are locked.
"""
from __future__ import annotations

import errno
import json
import math
import os
import socket
import sys
import threading
import time

from clusterwatch.train_requests import DUMP_STACKS, Handler, Refused, Request, RequestChannel

__all__ = ["report", "tags", "sent", "dropped", "invalid", "on_request", "Refused", "Request", "provenance",
           "DEFAULT_SOCKET", "SOCKET_ENV"]

SOCKET_ENV = "CLUSTERWATCH_TRAIN_SOCKET"
DEFAULT_SOCKET = "/run/clusterwatch/train.sock"
MAX_DATAGRAM = 4096          # the agent rejects larger ones
MAX_METRICS = 32
MAX_NAME = 64
MAX_TAG_VALUE = 256
_ABSENT_BACKOFF_S = 1.0
UNREACHED_GRACE_S = 10.0     # an agent never reached is said to be missing after this long
_TAGS_RESEND_S = 30.0        # an agent restarted since tags() learns them again
ALLOCATOR_EVERY_S = 5.0      # torch's allocator figures ride along at most this often
MAX_GPUS = 16                # allocator entries in one report
_MAX_INT = 2**63 - 1


class _State:
    """Everything per process; replaced wholesale in a forked child."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.sock: socket.socket | None = None
        self.path = ""
        self.sent = 0
        self.dropped = 0
        self.invalid = 0
        self.absent_until = 0.0
        self.tags: dict[str, str] = {}
        self.tags_text = ""  # ',"tags":{...}', encoded once per tags() call
        self.tags_due = math.inf  # monotonic time when tags ride along again; inf: no tags
        self.allocator_due = 0.0  # monotonic time when torch's allocator is read again
        self.uuids: dict[int, str] = {}  # torch device index -> its UUID (read once)
        self.channel: RequestChannel | None = None  # requests from the agent, once the socket is bound
        self.told = False  # whether this process was told (on stderr) that its reports cannot reach the agent
        self.failing_since = 0.0  # monotonic time of the first report that could not reach it


_state = _State()
_handlers: dict[str, Handler] = {}  # request name -> handler; a forked child keeps them
_own_record: dict | None = None  # provenance as computed in this process, once
_own_record_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _state, _own_record, _own_record_lock
    _own_record, _own_record_lock = None, threading.Lock()  # the record names the parent's pid
    old = _state
    _state = _State()
    _state.tags = dict(old.tags)
    _state.tags_text = old.tags_text
    _state.told = old.told  # the run's user was told already: a DataLoader worker does not say it again
    # the child's first report carries the tags: the agent knows the child by its own pid
    _state.tags_due = 0.0 if old.tags_text else math.inf
    if old.sock is not None:
        try:
            old.sock.close()  # the parent's descriptor, duplicated by fork; the parent keeps its own
        except OSError:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _number(value: object) -> str | None:
    """The JSON text of a finite number, None for anything else. Fast paths first."""
    t = type(value)
    if t is float:
        # x - x is 0.0 for finite x and NaN for inf and NaN: cheaper than math.isfinite
        return repr(value) if value - value == 0.0 else None  # type: ignore[operator]
    if t is int:
        return str(value) if -_MAX_INT <= value <= _MAX_INT else None  # type: ignore[operator]
    if isinstance(value, bool) or not hasattr(value, "__float__"):
        return None
    try:
        f = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return repr(f) if math.isfinite(f) else None


def _step(value: object) -> str | None:
    if type(value) is int:
        return str(value) if 0 <= value <= _MAX_INT else None  # type: ignore[operator]
    if isinstance(value, bool) or not hasattr(value, "__index__"):  # a NumPy integer has it
        return None
    try:
        i = value.__index__()  # type: ignore[union-attr]
    except (TypeError, ValueError):
        return None
    return str(i) if 0 <= i <= _MAX_INT else None


def _valid_text(text: str, limit: int) -> bool:
    """At most `limit` characters and encodable as UTF-8: the agent drops a whole report that
    carries a lone surrogate ("\\ud800", which json.dumps would happily escape)."""
    if len(text) > limit:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_names: dict[str, str] = {}  # metric name -> its JSON text; names repeat every step


def _name(name: str) -> str | None:
    """The JSON text of a metric name, None for one the agent would refuse (empty, long, not UTF-8)."""
    text = _names.get(name)
    if text is None:
        if not name or not _valid_text(name, MAX_NAME):
            return None
        text = json.dumps(name)
        if len(_names) < 1024:
            _names[name] = text
    return text


def _socket(st: _State) -> socket.socket | None:
    with st.lock:
        if st.sock is None:
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                sock.setblocking(False)
            except OSError:
                return None
            st.path = os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET
            st.sock = sock
            try:
                # an abstract autobound name the agent can answer to; the kernel's credentials
                # on what arrives say who sent it (train_requests checks them)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
                sock.bind("")
            except OSError:
                return sock  # reports still go; requests cannot come back
            st.channel = RequestChannel(sock, st.path, _handlers)
            st.channel.start()
        return st.sock


def _current() -> _State:
    # No os.getpid() check here: it is a system call on every report. A fork that
    # bypasses os.register_at_fork (a C-level fork) keeps the parent's socket, which
    # is harmless: every sendto is one whole datagram, and the kernel stamps it with
    # the pid of the process that sends it.
    return _state


def _count(st: _State, attr: str, n: int = 1) -> None:
    with st.lock:
        setattr(st, attr, getattr(st, attr) + n)


def _send(st: _State, body: str, now: float, with_tags: bool, extra: str = "") -> bool:
    """Send `{"v":1<body><extra>}`, with the tags when they are due; count the outcome.

    `extra` (the allocator's figures) is left out rather than the report dropped when the
    whole would not fit in one datagram.
    """
    if with_tags or (st.tags_text and now >= st.tags_due):
        body += st.tags_text
        with_tags = True
    data = ('{"v":1' + body + extra + "}").encode()
    if len(data) > MAX_DATAGRAM and extra:
        data = ('{"v":1' + body + "}").encode()
        st.allocator_due = 0.0  # the next report that has room carries them
    if len(data) > MAX_DATAGRAM:
        _count(st, "dropped")
        return False
    sock = st.sock or _socket(st)
    if sock is None:
        _count(st, "dropped")
        return False
    try:
        sock.sendto(data, st.path)
    except OSError as exc:
        full = isinstance(exc, (BlockingIOError, InterruptedError))
        with st.lock:
            st.dropped += 1
            if isinstance(exc, (FileNotFoundError, ConnectionRefusedError)):
                # no agent: skip the system call for a while; a full queue
                # (BlockingIOError) is different, it clears as soon as the agent reads
                st.absent_until = now + _ABSENT_BACKOFF_S
            if with_tags:
                st.tags_due = 0.0
            tell = False
            if not full and not st.told:
                # an agent reached before is gone: said at once; one never reached may be starting
                # after this process (`clusterwatch run` starts the command first): said after a grace
                if not st.failing_since:
                    st.failing_since = now
                tell = st.sent > 0 or now - st.failing_since >= UNREACHED_GRACE_S
                st.told = tell
        if tell:
            _tell_unreachable(st.path, exc)
        return False
    with st.lock:
        st.sent += 1
        if with_tags:
            st.tags_due = now + _TAGS_RESEND_S
    return True


_WHY = {
    errno.ENOENT: "no socket there (no agent runs on this node, it listens on another path, or its socket was "
                  "removed: a running agent binds it again within a poll)",
    errno.ECONNREFUSED: "the socket there is not read (its agent stopped)",
    errno.EACCES: "permission denied (its folder or the socket is not open to this user)",
    errno.EPERM: "permission denied",
}


def _tell_unreachable(path: str, exc: OSError) -> None:
    """One line on stderr, once a process: its reports do not reach the agent, why, and what to do.

    Silently dropped reports look, at the collector, like a step that stopped moving; the user who
    reads this line knows that the training went on and the reports did not arrive.
    """
    why = _WHY.get(exc.errno or 0) or exc.strerror or str(exc)
    line = (f"clusterwatch.train: reports of pid {os.getpid()} cannot reach the clusterwatch agent at {path}: "
            f"{why}; they are dropped (clusterwatch.train.dropped() counts them) until it can be reached, and "
            "this is said once. Check that the agent runs on this node and that CLUSTERWATCH_TRAIN_SOCKET names "
            "its --train-socket.\n")
    try:
        sys.stderr.write(line)
        sys.stderr.flush()
    except Exception:  # no stderr (closed, None): reporting never raises
        pass


def report(step: int | None = None, loss: float | None = None, lr: float | None = None,
           epoch: float | None = None, gpu_allocated_bytes: int | None = None,
           gpu_reserved_bytes: int | None = None, **metrics: float) -> bool:
    """Send one progress report to the agent; never blocks, never raises.

    Args:
        step: the global step (optimizer steps), an int >= 0.
        loss: the training loss.
        lr: the learning rate.
        epoch: the epoch, fractional allowed.
        gpu_allocated_bytes: memory your framework's allocator holds in live buffers on
            this process's current GPU (not needed with PyTorch: read by itself).
        gpu_reserved_bytes: memory that allocator holds from the driver (cached too).
        **metrics: more numbers (grad_norm=..., tokens_per_s=...), at most 32,
            names of at most 64 characters. Two names count the work done
            since the run began, and the collector's job_slowdown judges the
            job's throughput in them instead of steps/s (a larger batch is
            then no slowdown): `tokens` (the Hugging Face Trainer's
            `num_input_tokens_seen` reads the same) and `samples`. Send the
            count, not a rate, every step or with your logs.

    Returns:
        True when the report was handed to the kernel, False when it was dropped
        (no agent, full queue, too large). Invalid values are left out, counted by
        `invalid()`, and do not make the report fail.
    """
    st = _current()
    now = time.monotonic()
    if now < st.absent_until:
        _count(st, "dropped")
        return False
    body = ""
    bad = 0
    if step is not None:
        text = _step(step)
        if text is None:
            bad += 1
        else:
            body += ',"step":' + text
    for key, value in (("loss", loss), ("lr", lr), ("epoch", epoch)):
        if value is not None:
            text = _number(value)
            if text is None:
                bad += 1
            else:
                body += f',"{key}":' + text
    if metrics:
        items = []
        for name, value in metrics.items():
            text = _number(value)
            name_text = _name(name)
            if text is None or name_text is None or len(items) >= MAX_METRICS:
                bad += 1
            else:
                items.append(name_text + ":" + text)
        if items:
            body += ',"m":{' + ",".join(items) + "}"
    extra = ""
    if gpu_allocated_bytes is not None or gpu_reserved_bytes is not None:
        entry = []
        for key, value in (("allocated", gpu_allocated_bytes), ("reserved", gpu_reserved_bytes)):
            if value is not None:
                text = _step(value)  # the same rule: an int from 0 to 2**63-1
                if text is None:
                    bad += 1
                else:
                    entry.append(f'"{key}":' + text)
        if entry:
            extra = ',"gpu":[{' + ",".join(entry) + "}]"
    elif now >= st.allocator_due:
        st.allocator_due = now + ALLOCATOR_EVERY_S
        extra = _torch_allocator(st)
    if bad:
        _count(st, "invalid", bad)
    ok = _send(st, body, now, False, extra)
    channel = st.channel
    if channel is not None and channel.pending:
        channel.run_pending()
    return ok


_STAT_KEYS = (("allocated", "allocated_bytes.all.current"), ("reserved", "reserved_bytes.all.current"),
              ("alloc_retries", "num_alloc_retries"), ("inactive_split", "inactive_split_bytes.all.current"))


def _torch_allocator(st: _State) -> str:
    """',"gpu":[...]' with torch's caching-allocator figures, "" when torch has no CUDA in use here.

    Only a torch that is already imported and has initialised CUDA is asked: importing torch
    takes seconds and initialising CUDA creates a context on a GPU. memory_stats reads the
    allocator's host-side counters, so nothing here waits for the GPU. A device this process
    never allocated on (reserved 0) is left out unless it is the current one.
    """
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is None:
        return ""
    try:
        if not cuda.is_initialized():
            return ""
        current = cuda.current_device()
        entries = []
        for index in range(min(cuda.device_count(), MAX_GPUS)):
            stats = cuda.memory_stats(index)
            figures = {key: stats.get(name) for key, name in _STAT_KEYS}
            if figures["reserved"] is None:  # a build whose stats lack the key (the figure still exists)
                figures["reserved"] = cuda.memory_reserved(index)
            if figures["allocated"] is None:
                figures["allocated"] = cuda.memory_allocated(index)
            if not figures["reserved"] and index != current:
                continue
            uuid = st.uuids.get(index)
            if uuid is None:
                uuid = st.uuids[index] = _device_uuid(cuda, index)
            parts = [f'"index":{index}']
            if uuid:
                parts.append('"uuid":' + json.dumps(uuid))
            for key, value in figures.items():
                text = _step(value)
                if text is not None:
                    parts.append(f'"{key}":' + text)
            entries.append("{" + ",".join(parts) + "}")
    except Exception:  # a torch build that lacks a function or a CUDA error: no figures this time
        return ""
    return ',"gpu":[' + ",".join(entries) + "]" if entries else ""


def _device_uuid(cuda: object, index: int) -> str:
    """torch's UUID of a device ("" when this torch has none): the GPU's identity, unlike its index."""
    try:
        uuid = getattr(cuda.get_device_properties(index), "uuid", None)  # type: ignore[attr-defined]
    except Exception:
        return ""
    text = "" if uuid is None else str(uuid)
    return text if _valid_text(text, MAX_NAME) else ""


def tags(**labels: str) -> bool:
    """Label this run (experiment=..., dataset=...); merged with earlier labels.

    Labels are sent at once and ride along with a later report whenever that send
    failed, and every 30 s, so an agent that starts (or restarts) later still
    learns them.

    Args:
        **labels: names of at most 64 characters; values are turned into strings
            of at most 256 characters. Others are left out and counted (`invalid()`).
            At most 32 labels are kept.

    Returns:
        True when the labels were handed to the kernel now.
    """
    st = _current()
    bad = 0
    clean = {}
    for name, value in labels.items():
        text = None if value is None else str(value)
        if text is None or not name or not _valid_text(name, MAX_NAME) or not _valid_text(text, MAX_TAG_VALUE):
            bad += 1
        else:
            clean[name] = text
    with st.lock:
        st.invalid += bad
        merged = {**st.tags, **clean}
        if len(merged) > MAX_METRICS:
            st.invalid += len(merged) - MAX_METRICS
            merged = dict(list(merged.items())[:MAX_METRICS])
        st.tags = merged
        st.tags_text = ',"tags":' + json.dumps(merged, separators=(",", ":")) if merged else ""
    if not merged:
        return False
    return _send(st, "", time.monotonic(), True)


def on_request(name: str, handler: Handler | None) -> None:
    """Run `handler` when the agent asks this process for `name` ("checkpoint", "stop", ...).

    The handler runs in the training loop, inside the next `report()` after the request came,
    with the `Request` (name, id, args). It returns None or a message for the asker; it raises
    `Refused("why")` to decline, and any other exception is answered as a failure with its
    message (and does not reach the training loop). A `stop` handler may call `sys.exit()`: the
    answer goes out first. `dump_stacks` needs no handler: clusterwatch answers it itself.

    Args:
        name: the request's name, 1-64 printable characters.
        handler: the function, or None to remove the handler (later requests get "no_handler").

    Raises:
        ValueError: a name that no request can carry, or `dump_stacks`.
    """
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME or not name.isprintable():
        raise ValueError(f"a request name is 1-{MAX_NAME} printable characters, not {name!r}")
    if name == DUMP_STACKS:
        raise ValueError("dump_stacks is answered by clusterwatch.train itself (from a thread of its own, "
                         "so that it works while the training loop is stuck); it takes no handler")
    if handler is None:
        _handlers.pop(name, None)
    else:
        _handlers[name] = handler


def provenance() -> dict:
    """The record of the code this process runs: for checkpoints, log headers, a tracker's config.

    The agent's record when it has sent one (git state, submodules, a code_id that ranks
    compare, the redacted command line), else one computed here on the first call, with the
    same rule as the agent's: git runs as this user with nothing of the repository's that runs
    a program (hooks, fsmonitor, pager, filter drivers) and a 5 s budget
    (clusterwatch/train_provenance.py). Never raises: what git could not say is "unknown",
    with the reason in ["git"]["error"].

    Returns:
        A new dict each call: {"from": "agent" | "process", ..., "git": {"root", "commit",
        "branch", "dirty", "error", ...}}.
    """
    global _own_record
    channel = _state.channel
    if channel is not None and channel.provenance is not None:
        return json.loads(json.dumps({**channel.provenance, "from": "agent"}))
    with _own_record_lock:
        if _own_record is None:
            from clusterwatch.train_provenance import process_record  # git only when asked for

            _own_record = process_record()
        return json.loads(json.dumps(_own_record))


def sent() -> int:
    """Reports (and tag messages) this process handed to the kernel."""
    return _state.sent


def dropped() -> int:
    """Reports (and tag messages) this process dropped: no agent, full queue, too large."""
    return _state.dropped


def invalid() -> int:
    """Values and labels left out of reports because they were not valid."""
    return _state.invalid
