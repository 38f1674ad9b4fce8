"""gRPC's fork handlers off in clusterwatch's own processes, and the caller's setting back for user commands.

clusterwatch forks only to exec (git as a process's owner, py-spy, scontrol, ssh). gRPC's fork handlers,
on by default in grpcio, serve a fork *without* exec; in a child about to exec they can crash it before
the exec (SIGSEGV or SIGBUS with "epoll_wait error: Bad file descriptor": grpc/grpc#13873, #13998), and
git then reads as 'unknown'. gRPC's fork-support document says to switch them off whenever fork is always
followed by exec. gRPC reads the variable when it starts, so this runs before any channel or server.
"""
from __future__ import annotations

import os
from collections.abc import MutableMapping

VARIABLE = "GRPC_ENABLE_FORK_SUPPORT"
# the caller's own value (None: unset), given back to the commands clusterwatch runs for the user
_callers: str | None = None
_switched = False


def fork_handlers_off() -> None:
    """Switch gRPC's fork handlers off for this process and its own children, unless the caller chose."""
    global _callers, _switched
    if _switched:
        return
    _callers, _switched = os.environ.get(VARIABLE), True
    os.environ.setdefault(VARIABLE, "0")


def as_the_caller_had_it(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """`env` (a copy of this process's environment) with the caller's own setting, for a user's command."""
    if _switched:
        if _callers is None:
            env.pop(VARIABLE, None)
        else:
            env[VARIABLE] = _callers
    return env
