"""Requests from the collector to a training process on this node (TrainRequest), and their answers.

The collector asks (checkpoint, stop, memory_snapshot, dump_stacks) for a process it names by
(pid, start time). The agent asks only a process it watches whose pid still has that start time
(else the answer is `not_yours`), and only through the address that process reports from (a
process that never reported cannot be asked: `unreachable`). The request goes from the training
endpoint's socket (clusterwatch/train_requests.py checks it came from there); each answer the
process sends back ("accepted", then the handler's) is checked and passed on to the collector.

`dump_stacks` the agent answers itself, from outside, with `py-spy dump --pid PID` (the agent is
root: it needs no cooperation of the process, and works when the main thread is stuck in C code
holding the GIL, where the process's own listener cannot run). Where py-spy fails (not installed,
no ptrace) a process that reports is asked instead: its listener thread answers.

An answer is refused, and counted (`answers_refused`), when it is longer than MAX_REPLY bytes, not
UTF-8 JSON, names a request this agent did not send, or comes from another pid than the one asked
(any local process can write to the endpoint's socket; the kernel names the sender).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from clusterwatch.agent.signals import identity_refusal
from clusterwatch.v1 import agent_pb2

from clusterwatch.log_once import SaidOnce
from clusterwatch.train_requests import ACCEPTED, DONE, FAILED, MAX_MESSAGE, MAX_NAME, MAX_REPLY, NO_HANDLER, REFUSED

log = logging.getLogger("clusterwatch.agent")

KINDS = frozenset({"checkpoint", "stop", "memory_snapshot", "dump_stacks"})
UNREACHABLE, NOT_YOURS = "unreachable", "not_yours"
_FROM_PROCESS = frozenset({ACCEPTED, DONE, REFUSED, NO_HANDLER, FAILED})
_FINAL = frozenset({DONE, REFUSED, NO_HANDLER, FAILED})
PY_SPY_TIMEOUT_S = 10.0       # a dump of a big process takes about a second
ANSWER_WAIT_S = 900.0         # a handler runs at the next report(): a slow step, a long checkpoint
MAX_PENDING = 256             # requests waiting for a process's answer
MAX_WORKERS = 8               # requests handled at once (each may run py-spy)
MAX_ARGS = 16

Reply = Callable[[agent_pb2.TrainAnswer], None]


@dataclass
class _Pending:
    pid: int
    start_time: float
    kind: str
    reply: Reply
    deadline: float


def cut_stacks(text: str, limit: int = MAX_REPLY) -> tuple[str, bool]:
    """`text` within `limit` UTF-8 bytes, cut at a thread's start ("\\nThread ") if it must be cut."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text, False
    head = data[:limit].decode("utf-8", "ignore")
    cut = head.rfind("\nThread ")
    return (head[:cut + 1] if cut > 0 else head), True


def py_spy_path() -> str | None:
    """py-spy beside this interpreter (the agent's venv) or on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else shutil.which("py-spy")


def answer(req: agent_pb2.TrainRequest, status: str, message: str = "", payload: str = "",
           truncated: bool = False) -> agent_pb2.TrainAnswer:
    return agent_pb2.TrainAnswer(id=req.id, pid=req.pid, start_time=req.start_time, status=status,
                                 message=message[:MAX_MESSAGE], payload=payload, truncated=truncated)


class TrainAsker:
    """Handles the collector's TrainRequests for the processes of this node.

    Args:
        endpoint: the training endpoint (agent/train_endpoint.py): sends requests, hands back answers.
        start_time: pid -> its start time (None when gone), from the process source.
        watched: whether a pid is one the agent watches.
        py_spy: the py-spy executable; None: looked up (beside the interpreter, then on PATH).
    """

    def __init__(self, endpoint, start_time: Callable[[int], float | None], watched: Callable[[int], bool],
                 py_spy: str | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.endpoint = endpoint
        self.start_time = start_time
        self.watched = watched
        self.py_spy = py_spy if py_spy is not None else py_spy_path()
        self.clock = clock
        self.answers_refused = 0
        self.requests = 0
        self._said = SaidOnce(log)  # one line for the first refused answer; the rest are counted
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()
        self._workers = threading.BoundedSemaphore(MAX_WORKERS)
        endpoint.on_reply = self.on_reply

    # -- requests (on the sender's thread: nothing here may block) -----------------------------

    def __call__(self, req: agent_pb2.TrainRequest, reply: Reply) -> None:
        self.requests += 1
        if not self._workers.acquire(blocking=False):
            reply(answer(req, REFUSED, f"the agent handles {MAX_WORKERS} requests at once already; ask again"))
            return
        threading.Thread(target=self._handle, args=(req, reply), name="cw-train-ask", daemon=True).start()

    def _handle(self, req: agent_pb2.TrainRequest, reply: Reply) -> None:
        try:
            why = self._refusal(req)
            if why:
                log.warning("not asking pid %d for %s (%s): %s", req.pid, req.kind, req.asked_by, why)
                reply(answer(req, NOT_YOURS if why != "kind" else REFUSED,
                             why if why != "kind" else f"unknown request {req.kind[:MAX_NAME]!r}; "
                             f"one of {', '.join(sorted(KINDS))}"))
                return
            log.warning("asking pid %d for %s (%s)", req.pid, req.kind, req.asked_by)
            if req.kind == "dump_stacks":
                text, why = self._py_spy(req.pid)
                if text is not None:
                    stacks, cut = cut_stacks(text)
                    reply(answer(req, DONE, "read from outside with py-spy dump", stacks, cut))
                    return
                if self.endpoint.reply_address(req.pid, req.start_time) is None:
                    reply(answer(req, FAILED, why))
                    return
            self._forward(req, reply)
        except Exception as exc:  # the collector waits for an answer: always give one
            log.exception("request %s to pid %d failed", req.kind, req.pid)
            reply(answer(req, FAILED, f"the agent failed: {type(exc).__name__}: {exc}"))
        finally:
            self._workers.release()

    def _refusal(self, req: agent_pb2.TrainRequest) -> str:
        if req.kind not in KINDS:
            return "kind"
        return identity_refusal(req.pid, req.start_time, self.watched, self.start_time)

    def _py_spy(self, pid: int) -> tuple[str | None, str]:
        if self.py_spy is None:
            return None, "py-spy is not installed beside the agent (pip install py-spy)"
        try:
            done = subprocess.run([self.py_spy, "dump", "--pid", str(pid)], capture_output=True,
                                  timeout=PY_SPY_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return None, f"py-spy dump did not finish within {PY_SPY_TIMEOUT_S:.0f} s"
        except OSError as exc:
            return None, f"cannot run {self.py_spy}: {exc.strerror or exc}"
        if done.returncode != 0:
            said = done.stderr.decode("utf-8", "replace").strip().splitlines()
            return None, f"py-spy dump failed: {said[-1][:300] if said else f'exit {done.returncode}'}"
        return done.stdout.decode("utf-8", "replace"), ""

    def _forward(self, req: agent_pb2.TrainRequest, reply: Reply) -> None:
        # the collector's args are strings; a step number (at_step) goes as the number the handlers read
        args = {k: int(v) if v.isascii() and v.isdigit() and len(v) <= 18 else v
                for k, v in list(req.args.items())[:MAX_ARGS]}
        sent_id = req.id if 1 <= len(req.id) <= MAX_NAME and req.id.isprintable() else uuid.uuid4().hex
        data = json.dumps({"v": 1, "request": req.kind, "id": sent_id, "pid": req.pid, "args": args}).encode()
        now = self.clock()
        with self._lock:
            for key in [k for k, p in self._pending.items() if p.deadline < now]:
                del self._pending[key]
            if len(self._pending) >= MAX_PENDING:
                reply(answer(req, REFUSED, f"{MAX_PENDING} requests already wait for their processes' answers"))
                return
            self._pending[sent_id] = _Pending(req.pid, req.start_time, req.kind,
                                              lambda a, r=reply, i=req.id: r(_renamed(a, i)), now + ANSWER_WAIT_S)
        why = self.endpoint.send(req.pid, req.start_time, data)
        if why:
            with self._lock:
                self._pending.pop(sent_id, None)
            reply(answer(req, UNREACHABLE, why))

    # -- answers (on the endpoint's reader thread) ----------------------------------------------

    def on_reply(self, pid: int, data: bytes, cut: bool) -> None:
        why = self._take(pid, data, cut)
        if why:
            self.answers_refused += 1
            self._said.warning("refused", "training endpoint: refused an answer from pid %d: %s (further ones "
                               "are counted only)", pid, why)

    def _take(self, pid: int, data: bytes, cut: bool) -> str:
        if cut or len(data) > MAX_REPLY:
            return f"longer than {MAX_REPLY} bytes"
        try:
            obj = json.loads(data)
        except (UnicodeDecodeError, ValueError, RecursionError):
            return "not UTF-8 JSON"
        if not isinstance(obj, dict):
            return "not an object"
        ident, status, message, payload = obj.get("reply"), obj.get("status"), obj.get("message", ""), obj.get("data")
        if not isinstance(ident, str) or status not in _FROM_PROCESS or not isinstance(message, str) \
                or not (payload is None or isinstance(payload, str)):
            return "not an answer (reply, status, message, data)"
        with self._lock:
            pending = self._pending.get(ident)
            if pending is None:
                return "it answers no request of this agent's"
            if pending.pid != pid:
                return f"it answers pid {pending.pid}'s request"
            if status in _FINAL:
                del self._pending[ident]
        try:
            message.encode("utf-8")
            (payload or "").encode("utf-8")
        except UnicodeEncodeError:
            return "a lone surrogate in its text"
        stacks, truncated = cut_stacks(payload) if payload else ("", False)
        pending.reply(agent_pb2.TrainAnswer(id=ident, pid=pid, start_time=pending.start_time, status=status,
                                            message=message[:MAX_MESSAGE], payload=stacks,
                                            truncated=truncated or obj.get("truncated") is True))
        return ""


def _renamed(a: agent_pb2.TrainAnswer, request_id: str) -> agent_pb2.TrainAnswer:
    a.id = request_id
    return a
