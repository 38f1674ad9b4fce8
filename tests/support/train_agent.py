"""A socket that plays the node agent's part for clusterwatch.train's requests: bound where the process
reports to, with the kernel's credentials on, reading reports and answers, sending requests."""
from __future__ import annotations

import json
import shutil
import socket
import tempfile
import time
from pathlib import Path

import pytest

from clusterwatch import train_requests as tr

FINAL = {tr.DONE, tr.REFUSED, tr.NO_HANDLER, tr.FAILED}


class Agent:
    """The agent's part: bound at the path the process reports to, with the kernel's credentials on."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.settimeout(0.2)
        self.reports: list[dict] = []
        self.replies: list[dict] = []
        self.address: bytes | None = None
        self.sender_pid: int | None = None

    def pump(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                data, anc, _flags, addr = self.sock.recvmsg(tr.MAX_REPLY + 1, socket.CMSG_SPACE(12))
            except TimeoutError:
                continue
            obj = json.loads(data)
            if "reply" in obj:
                self.replies.append(obj)
            else:
                self.reports.append(obj)
                self.address = addr
                for _level, kind, payload in anc:
                    if kind == socket.SCM_CREDENTIALS:
                        self.sender_pid = int.from_bytes(payload[:4], "little")

    def first_report(self) -> bytes:
        deadline = time.monotonic() + 15
        while self.address is None and time.monotonic() < deadline:
            self.pump(0.2)
        assert self.address, "no report came"
        return self.address

    def ask(self, name: str, ident: str, pid: int, **args) -> None:
        assert self.address is not None
        self.sock.sendto(json.dumps({"v": 1, "request": name, "id": ident, "pid": pid, "args": args}).encode(),
                         self.address)

    def answers(self, ident: str, timeout: float = 10.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            mine = [r for r in self.replies if r["reply"] == ident]
            if mine and mine[-1]["status"] in FINAL:
                return mine
            self.pump(0.1)
        return [r for r in self.replies if r["reply"] == ident]

    def wait_for_step(self, step: int, timeout: float = 30.0) -> None:
        """Pump until a report of `step` or later came (that step's end has then passed)."""
        deadline = time.monotonic() + timeout
        while max((r.get("step", 0) for r in self.reports), default=0) < step:
            assert time.monotonic() < deadline, f"no report of step {step} came"
            self.pump(0.1)

    def checkpoint_then_stop(self, pid: int, target: int) -> None:
        """Ask the process for a checkpoint at the end of step `target`, then, once that step has passed (its save
        comes first), to stop; each answered as done."""
        self.ask("checkpoint", "c1", pid, at_step=target)
        got = self.answers("c1")
        assert (got[-1]["status"], got[-1]["message"]) == ("done", f"the trainer saves at the end of step {target}")
        self.wait_for_step(target + 1)
        self.ask("stop", "s1", pid)
        assert self.answers("s1")[-1]["status"] == "done"

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def sock_dir():
    d = Path(tempfile.mkdtemp(prefix="cw-req-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def agent(sock_dir):
    a = Agent(str(sock_dir / "train.sock"))
    yield a
    a.close()


