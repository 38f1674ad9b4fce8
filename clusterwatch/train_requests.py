"""Requests from the node's agent back to a training process: the process's side. Standard library only.

The channel is the socket `clusterwatch.train` already reports from. That socket is bound to an
autobound abstract address (Linux gives it a unique name such as `\\0a1b2c` on `bind("")`), so
the agent, which learns the address from every report it receives, can send datagrams back. An
abstract address has no file permissions: any local process could send to it. So every
datagram that arrives is checked before anything is done with it:

- the kernel's credentials (SO_PASSCRED, SCM_CREDENTIALS, which a user cannot forge) must be
  root's or this process's own uid; and
- the sender must be bound at the agent's socket (the path reports go to, compared by inode),
  which only the agent can bind (its directory is the agent's, 0755); and
- the request must name this process's pid, so a request meant for a process that exited, whose
  autobound name the kernel gave to a newer one, is refused.

Anything else is dropped and counted, never answered.

The agent may also push this process's provenance record, unasked, once it has taken it:
    {"v": 1, "provenance": {...}}
which `clusterwatch.train.provenance()` then returns instead of asking git itself.

Request (agent to process), one JSON object:
    {"v": 1, "request": name, "id": string, "pid": int, "args": {...}}
Answer (process to the agent's socket), one JSON object:
    {"v": 1, "reply": id, "request": name, "status": status, "message": string, "data": ...}
with status one of ACCEPTED (sent at once when a handler will run at the next report()), DONE,
REFUSED (the handler raised `Refused`, or the request was not valid), NO_HANDLER, FAILED (the
handler raised; the message says what). `data` is only in `dump_stacks`'s answer: the stacks of
every other thread in py-spy's `dump` text format. An answer is at most MAX_REPLY bytes (stacks
are cut at a thread boundary and `"truncated": true` says so); the agent reads replies with a
buffer that large, reports with MAX_DATAGRAM.

Handlers run in the training loop, inside the next `report()`, never in a signal handler or on
the listener thread: a checkpoint written there is consistent with the step just reported.
`memory_snapshot` has a built-in handler (clusterwatch/train_snapshot.py) that a user's handler
replaces. `dump_stacks` is the exception: it is answered by the listener thread at once, because a hung
collective never calls `report()` again. (It needs the GIL; a thread stuck in C code that holds
the GIL blocks it, and then only a dump from outside, `py-spy dump`, can see the stacks.)
"""
from __future__ import annotations

import collections
import json
import os
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ACCEPTED, DONE, REFUSED, NO_HANDLER, FAILED = "accepted", "done", "refused", "no_handler", "failed"
DUMP_STACKS = "dump_stacks"
MAX_REQUEST = 4096
MAX_PUSH = 65536           # the agent's provenance record, pushed unasked
MAX_REPLY = 60000          # well under the default socket send buffer (212992)
MAX_NAME = 64
MAX_MESSAGE = 1024
MAX_PENDING = 16           # requests waiting for the next report()
_UCRED = struct.Struct("iII")
_CMSG_SPACE = socket.CMSG_SPACE(_UCRED.size)


class Refused(Exception):
    """Raised by a request handler that will not do what was asked; the message goes to the asker."""


@dataclass(frozen=True, slots=True)
class Request:
    """One request from the agent.

    Attributes:
        name: what is asked ("checkpoint", "stop", "memory_snapshot", ...).
        id: the asker's id for it, echoed in the answer.
        args: arguments, as the asker sent them (a JSON object).
    """

    name: str
    id: str
    args: dict[str, Any] = field(default_factory=dict)


Handler = Callable[[Request], Any]


def _memory_snapshot(request: Request) -> str:
    """The built-in `memory_snapshot` handler (clusterwatch/train_snapshot.py)."""
    from clusterwatch.train_snapshot import VIEWER, NoSnapshot, take_snapshot

    try:
        path = take_snapshot()
    except NoSnapshot as exc:
        raise Refused(str(exc)) from None
    return f"wrote {path} (mode 0600); open it in PyTorch's memory viewer, {VIEWER}"


# Requests clusterwatch answers itself, in the loop, when the user registered no handler for them.
BUILTIN: dict[str, Handler] = {"memory_snapshot": _memory_snapshot}


def _short_text(value: object, what: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME or not value.isprintable():
        raise ValueError(f"{what} is not a printable string of 1-{MAX_NAME} characters")
    return value


def parse_request(data: bytes, pid: int) -> Request:
    """A request datagram for process `pid`.

    Raises:
        ValueError: not a version-1 request object, a field of the wrong shape, or meant for
            another pid (the message says which).
    """
    if len(data) > MAX_REQUEST:
        raise ValueError("request too large")
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ValueError("not JSON") from None
    if not isinstance(obj, dict) or type(obj.get("v")) is not int or obj["v"] != 1:
        raise ValueError("not a version-1 object")
    name = _short_text(obj.get("request"), "request")
    request_id = _short_text(obj.get("id"), "id")
    target = obj.get("pid")
    if type(target) is not int or target != pid:
        raise ValueError(f"the request names pid {target!r}, this is pid {pid}")
    args = obj.get("args", {})
    if not isinstance(args, dict):
        raise ValueError("args is not an object")
    return Request(name, request_id, args)


def request_id_of(data: bytes) -> tuple[str, str] | None:
    """(id, request) of a datagram that failed `parse_request`, when it has them, to answer it."""
    try:
        obj = json.loads(data)
        return _short_text(obj["id"], "id"), str(obj.get("request", ""))[:MAX_NAME]
    except Exception:
        return None


def reply_datagram(request_id: str, name: str, status: str, message: str = "",
                   data: str | None = None) -> bytes:
    """The answer to a request, at most MAX_REPLY bytes (`data` is cut at a thread's start if needed)."""
    obj: dict[str, Any] = {"v": 1, "reply": request_id, "request": name, "status": status,
                           "message": message[:MAX_MESSAGE]}
    head = json.dumps(obj, ensure_ascii=True)
    if data is None:
        return head.encode()
    text = data
    while True:
        out = json.dumps({**obj, "data": text, **({"truncated": True} if text is not data else {})},
                         ensure_ascii=True).encode()
        if len(out) <= MAX_REPLY:
            return out
        cut = text.rfind("\nThread ", 0, max(0, len(text) * (MAX_REPLY - len(head) - 64) // len(out)))
        text = text[:cut + 1] if cut > 0 else ""


# -- stacks ---------------------------------------------------------------------------------------

def _thread_state(native_id: int | None) -> str:
    """py-spy's word for a thread: "active" when the kernel has it running, else "idle"."""
    if native_id is None:
        return "idle"
    try:
        with open(f"/proc/self/task/{native_id}/stat", "rb") as f:
            stat = f.read()
        return "active" if stat[stat.rindex(b")") + 2:][:1] == b"R" else "idle"
    except (OSError, ValueError):
        return "idle"


def format_stacks(exclude: int | None = None) -> str:
    """Every thread's Python stack but `exclude`'s, innermost frame first, as `py-spy dump` prints it.

    The same text as py-spy's, so that one parser (clusterwatch.stacks) groups both.
    """
    threads = {t.ident: t for t in threading.enumerate()}
    lines = [f"Process {os.getpid()}: {' '.join(sys.orig_argv) if hasattr(sys, 'orig_argv') else sys.executable}",
             f"Python v{sys.version.split()[0]} ({sys.executable})", ""]
    for ident, frame in sys._current_frames().items():
        if ident == exclude:
            continue
        thread = threads.get(ident)
        native = getattr(thread, "native_id", None)
        shown = str(native) if native is not None else f"{ident:#X}"
        name = f': "{thread.name}"' if thread is not None else ""
        lines.append(f"Thread {shown} ({_thread_state(native)}){name}")
        f: Any = frame
        while f is not None:
            code = f.f_code
            lines.append(f"    {code.co_name} ({code.co_filename}:{f.f_lineno})")
            f = f.f_back
    return "\n".join(lines) + "\n"


# -- the listener ---------------------------------------------------------------------------------

class RequestChannel:
    """Receives requests on a training process's socket; answers them or queues them for report().

    Args:
        sock: the process's bound datagram socket (non-blocking, SO_PASSCRED set).
        agent_path: the agent's socket path (where reports go).
        handlers: name -> handler, shared with `clusterwatch.train.on_request` (read when a
            request arrives and when it runs).

    Attributes:
        rejected: datagrams dropped unanswered: not from the agent, or unreadable.
        lost: answers the kernel did not take (the agent's queue stayed full).
    """

    def __init__(self, sock: socket.socket, agent_path: str, handlers: dict[str, Handler]) -> None:
        self.sock = sock
        self.agent_path = agent_path
        self.handlers = handlers
        self.pending: collections.deque[Request] = collections.deque()
        self.provenance: dict[str, Any] | None = None  # the agent's record, when it sent one
        self.rejected = 0
        self.lost = 0
        self._run_lock = threading.Lock()
        self._thread = threading.Thread(target=self._listen, name="clusterwatch-train-requests", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # -- the listener thread --------------------------------------------------------------

    def _listen(self) -> None:
        poll = select.poll()
        poll.register(self.sock, select.POLLIN)
        while True:
            try:
                events = poll.poll()
            except OSError:
                return
            if any(ev & (select.POLLNVAL | select.POLLHUP) for _, ev in events):
                return  # the socket was closed
            for _ in range(64):
                try:
                    data, ancdata, flags, addr = self.sock.recvmsg(MAX_PUSH + 1, _CMSG_SPACE)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    return
                try:
                    self._take(data, ancdata, flags, addr)
                except Exception:  # never let the listener die: requests would go unanswered
                    self.rejected += 1

    def _from_agent(self, ancdata: list, flags: int, addr: object) -> bool:
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            return False
        uid = None
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(payload) >= _UCRED.size:
                _pid, uid, _gid = _UCRED.unpack_from(payload)
        if uid not in (0, os.geteuid()):
            return False
        if not isinstance(addr, str) or not addr:  # unnamed or abstract: not the agent's socket
            return False
        if addr == self.agent_path:
            return True
        try:
            a, b = os.stat(addr), os.stat(self.agent_path)
        except OSError:
            return False
        return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)

    def _take(self, data: bytes, ancdata: list, flags: int, addr: object) -> None:
        if not self._from_agent(ancdata, flags, addr):
            self.rejected += 1
            return
        if data.startswith(b'{"v":1,"provenance":') and len(data) <= MAX_PUSH:
            try:
                record = json.loads(data)["provenance"]
            except (ValueError, RecursionError):
                record = None
            if isinstance(record, dict):
                self.provenance = record
            else:
                self.rejected += 1
            return
        try:
            request = parse_request(data, os.getpid())
        except ValueError as exc:
            self.rejected += 1
            ident = request_id_of(data)
            if ident is not None:  # the agent asked something wrong: say what
                self.answer(ident[0], ident[1], REFUSED, str(exc), wait_s=0.5)
            return
        if request.name == DUMP_STACKS:
            self.answer(request.id, request.name, DONE,
                        data=format_stacks(exclude=threading.get_ident()), wait_s=0.5)
        elif request.name not in self.handlers and request.name not in BUILTIN:
            self.answer(request.id, request.name, NO_HANDLER,
                        f"this process has no handler for {request.name!r} (clusterwatch.train.on_request)",
                        wait_s=0.5)
        elif len(self.pending) >= MAX_PENDING:
            self.answer(request.id, request.name, REFUSED,
                        f"{MAX_PENDING} requests already wait for the next report()", wait_s=0.5)
        elif any(p.id == request.id for p in list(self.pending)):
            return  # the agent resent it: the first answer stands
        else:
            self.pending.append(request)
            self.answer(request.id, request.name, ACCEPTED, "runs at the next clusterwatch.train.report()",
                        wait_s=0.5)

    # -- the training loop's side ---------------------------------------------------------

    def run_pending(self) -> None:
        """Run the handlers of the requests that arrived; called by report() when there are some.

        A handler that raises SystemExit or KeyboardInterrupt (a `stop` that exits) is answered
        first, then the exception goes on.
        """
        if not self._run_lock.acquire(blocking=False):
            return  # another thread's report() is running them
        try:
            while self.pending:
                request = self.pending.popleft()
                handler = self.handlers.get(request.name) or BUILTIN.get(request.name)
                if handler is None:
                    self.answer(request.id, request.name, NO_HANDLER, "the handler was removed")
                    continue
                try:
                    result = handler(request)
                except Refused as exc:
                    self.answer(request.id, request.name, REFUSED, str(exc))
                except Exception as exc:
                    self.answer(request.id, request.name, FAILED, f"{type(exc).__name__}: {exc}")
                except BaseException as exc:
                    status = DONE if isinstance(exc, SystemExit) and exc.code in (None, 0) else FAILED
                    self.answer(request.id, request.name, status, f"the handler raised {type(exc).__name__}")
                    raise
                else:
                    self.answer(request.id, request.name, DONE, "" if result is None else str(result))
        finally:
            self._run_lock.release()

    def answer(self, request_id: str, name: str, status: str, message: str = "", data: str | None = None,
               wait_s: float = 0.05) -> bool:
        """Send one answer to the agent; retried for up to `wait_s` while its queue is full."""
        datagram = reply_datagram(request_id, name, status, message, data)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.sock.sendto(datagram, self.agent_path)
                return True
            except (BlockingIOError, InterruptedError):
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.002)
            except OSError:
                break
        self.lost += 1
        return False
