"""``scontrol listpids JOB NODE`` run on the node itself over SSH (asyncssh).

listpids only sees the slurmstepd processes of the host it runs on, so the collector asks each node.
Host keys are always checked against a known_hosts file; a missing or different key is refused with
one line naming the host and the file. Connections are reused per host, concurrency is bounded by a
semaphore, and both connecting and the command have timeouts.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import asyncssh
from clusterwatch.collector.jobmap.base import JobMapper, SlurmUnavailable

from clusterwatch.errors import ParseError
from clusterwatch.slurm.listpids import PidEntry, parse_listpids
from clusterwatch.slurm.node_names import why_not_a_node_name
from clusterwatch.slurm.scontrol import JobRecord

_NO_PIDS = ("There are no steps for job", "does not exist on node", "no steps")


class SshHostKeyRejected(SlurmUnavailable):
    """The node's host key is not in our known_hosts file, or differs from the one there."""


class SshUnreachable(SlurmUnavailable):
    """The node did not accept an SSH connection in time (or refused it, or refused our key)."""


class SshListpids:
    """Ask nodes for a job's processes over SSH.

    Args:
        known_hosts: the known_hosts file that every host key is checked against (never skipped).
        client_keys: private key files to log in with.
        username: the remote user (root sees every job's slurmstepd).
        address: node name → (host, port); by default the node name itself, port 22.
        connect_timeout_s: seconds to set up a connection, host key check and login included.
        command_timeout_s: seconds for the remote ``scontrol listpids``.
        max_concurrency: at most this many SSH commands at once, over all nodes.
        scontrol: the scontrol command on the nodes.
    """

    def __init__(
        self,
        known_hosts: Path,
        client_keys: Sequence[Path],
        username: str = "root",
        address: Callable[[str], tuple[str, int]] | Mapping[str, tuple[str, int]] | None = None,
        connect_timeout_s: float = 5.0,
        command_timeout_s: float = 10.0,
        max_concurrency: int = 16,
        scontrol: str = "scontrol",
    ) -> None:
        self._known_hosts = Path(known_hosts)
        self._client_keys = [str(k) for k in client_keys]
        self._username = username
        if address is None:
            self._address: Callable[[str], tuple[str, int]] = lambda node: (node, 22)
        elif isinstance(address, Mapping):
            table = dict(address)
            self._address = lambda node: table[node]
        else:
            self._address = address
        self._connect_timeout_s = connect_timeout_s
        self._command_timeout_s = command_timeout_s
        self._semaphore = asyncio.Semaphore(max_concurrency)
        self._scontrol = scontrol
        self._conns: dict[tuple[str, int], asyncssh.SSHClientConnection] = {}
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}

    async def _connection(self, node: str, host: str, port: int) -> asyncssh.SSHClientConnection:
        key = (host, port)
        lock = self._locks.setdefault(key, asyncio.Lock())
        # One connect per host even when many listpids for that host start together.
        async with lock:
            conn = self._conns.get(key)
            if conn is not None and not conn.is_closed():
                return conn
            where = f"{host}:{port} (node {node})"
            try:
                conn = await asyncio.wait_for(
                    asyncssh.connect(
                        host,
                        port=port,
                        username=self._username,
                        client_keys=self._client_keys,
                        known_hosts=str(self._known_hosts),
                        agent_path=None,
                        config=[],
                        connect_timeout=self._connect_timeout_s,
                    ),
                    self._connect_timeout_s,
                )
            except asyncssh.HostKeyNotVerifiable:
                raise SshHostKeyRejected(
                    f"ssh {where}: host key not trusted by {self._known_hosts} (unknown or changed); "
                    "check the key and update that file"
                ) from None
            except asyncio.TimeoutError:
                raise SshUnreachable(
                    f"ssh {where}: no connection within {self._connect_timeout_s:g} s; is sshd running there?"
                ) from None
            except asyncssh.PermissionDenied:
                raise SshUnreachable(f"ssh {where}: login as {self._username} refused (client key)") from None
            except (OSError, asyncssh.Error) as exc:
                raise SshUnreachable(f"ssh {where}: {exc.__class__.__name__}: {exc}") from None
            self._conns[key] = conn
            return conn

    async def listpids(self, job_id: int, node: str) -> list[PidEntry]:
        """Run ``scontrol listpids JOB NODE`` on ``node`` and parse it.

        Returns:
            The job's processes on the node; empty when it has none there.

        Raises:
            SshHostKeyRejected: the host key is unknown or changed.
            SshUnreachable: no connection or login within the connect timeout.
            SlurmUnavailable: the remote command timed out or failed, or `node` is not one node's name.
        """
        why = why_not_a_node_name(node)
        if why:  # it names the host to log in to and scontrol's argument: one node, never an option or a list
            raise SlurmUnavailable(f"not asking {node[:200]!r} for listpids: {why}")
        host, port = self._address(node)
        command = shlex.join([self._scontrol, "listpids", str(int(job_id)), node])
        async with self._semaphore:
            conn = await self._connection(node, host, port)
            try:
                result = await asyncio.wait_for(conn.run(command, check=False), self._command_timeout_s)
            except asyncio.TimeoutError:
                raise SlurmUnavailable(
                    f"ssh {host}:{port} (node {node}): '{command}' did not finish within "
                    f"{self._command_timeout_s:g} s"
                ) from None
            except (OSError, asyncssh.Error) as exc:
                # A broken connection is dropped so the next call reconnects.
                self._conns.pop((host, port), None)
                raise SshUnreachable(f"ssh {host}:{port} (node {node}): {exc}") from None
        stdout = str(result.stdout or "")
        stderr = str(result.stderr or "")
        if result.exit_status != 0:
            if any(marker in stderr for marker in _NO_PIDS):
                return []
            line = (stderr.strip().splitlines() or [f"exit status {result.exit_status}"])[-1]
            raise SlurmUnavailable(f"ssh {host}:{port} (node {node}): '{command}' failed: {line}")
        try:
            return parse_listpids(stdout)
        except ParseError as exc:
            raise SlurmUnavailable(f"ssh {host}:{port} (node {node}): {exc}") from None

    async def close(self) -> None:
        """Close every open connection."""
        conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            conn.close()
        for conn in conns:
            await conn.wait_closed()


class SshJobMapper:
    """A JobMapper: jobs from another mapper (``scontrol`` on the collector host), PIDs over SSH.

    Args:
        jobs: answers show_job and list_jobs (usually a ScontrolMapper).
        pids: answers listpids on the nodes.
    """

    def __init__(self, jobs: JobMapper, pids: SshListpids) -> None:
        self._jobs = jobs
        self._pids = pids

    @property
    def records_skipped(self) -> int:
        """The job mapper's (SSH only asks for pids)."""
        return self._jobs.records_skipped

    async def show_job(self, job_id: int) -> JobRecord | None:
        """See :meth:`JobMapper.show_job`."""
        return await self._jobs.show_job(job_id)

    async def list_jobs(self) -> list[JobRecord]:
        """See :meth:`JobMapper.list_jobs`."""
        return await self._jobs.list_jobs()

    async def listpids(self, job_id: int, node: str) -> list[PidEntry]:
        """See :meth:`SshListpids.listpids`."""
        return await self._pids.listpids(job_id, node)

    async def close(self) -> None:
        """Close the SSH connections."""
        await self._pids.close()
