"""gRPC's fork handlers are off in clusterwatch's processes and back as the caller had them for a user's command
(clusterwatch/grpc_fork.py): the agent forks git and py-spy beside its gRPC stream, and gRPC's handlers could
crash such a child before its exec (git exited with -7 / -11 under the suite's in-process gRPC)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from clusterwatch import grpc_fork
from tests.support.helpers import CLI, clean_environ, wait_for

VARIABLE = "GRPC_ENABLE_FORK_SUPPORT"
SHOW = ("import os, sys, time; sys.stdout.write(repr(os.environ.get('GRPC_ENABLE_FORK_SUPPORT')) + '\\n'); "
        "sys.stdout.flush(); time.sleep(4)")


def _agent_environ(run_pid: int) -> dict[str, str] | None:
    """The environment `run`'s embedded agent was started with, from /proc; None before it runs."""
    import psutil

    for child in psutil.Process(run_pid).children(recursive=True):
        try:
            args = child.cmdline()
        except psutil.Error:  # a short-lived helper gone meanwhile
            continue
        if "agent" in args:
            raw = open(f"/proc/{child.pid}/environ", "rb").read().split(b"\0")
            return dict(item.decode(errors="replace").partition("=")[::2] for item in raw if b"=" in item)
    return None


@pytest.mark.parametrize("callers", [None, "1"])
def test_run_turns_them_off_for_itself_and_gives_the_command_the_callers_value(callers):
    env = {k: v for k, v in clean_environ().items() if k != VARIABLE}
    if callers is not None:
        env[VARIABLE] = callers
    proc = subprocess.Popen([*CLI, "run", "--interval", "0.5", "--gpu-source", "none", "--status-every", "0",
                             "--", sys.executable, "-c", SHOW],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        said = proc.stdout.readline().strip()
        assert said == repr(callers)
        agent_env = wait_for(lambda: _agent_environ(proc.pid), what="run's agent")
        # the caller's choice kept; unset, off for clusterwatch's own processes
        assert agent_env.get(VARIABLE) == (callers or "0")
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


def test_the_callers_value_given_back(monkeypatch):
    monkeypatch.setattr(grpc_fork, "_switched", False)
    monkeypatch.delenv(VARIABLE, raising=False)
    grpc_fork.fork_handlers_off()
    assert os.environ[VARIABLE] == "0"
    assert VARIABLE not in grpc_fork.as_the_caller_had_it(dict(os.environ))
    monkeypatch.setattr(grpc_fork, "_switched", False)
    monkeypatch.setenv(VARIABLE, "true")
    grpc_fork.fork_handlers_off()
    assert os.environ[VARIABLE] == "true" and grpc_fork.as_the_caller_had_it({VARIABLE: "0"}) == {VARIABLE: "true"}
