"""The agent's proof that it is root on its node: a fresh munge credential for each stream.

Every Slurm node runs munged with the cluster's key, so nothing needs setting up: `munge` run by the
agent (root) makes a credential of uid 0 that the collector decodes with `unmunge`
(collector/ingest/agent_auth.py), learning the uid and the host that made it. A credential is good once
(munged refuses a replay), hence one per stream.
"""
from __future__ import annotations

import asyncio
import shutil

# The payload the collector takes from an agent (collector/ingest/agent_auth.py AGENT_PAYLOAD): a query's
# credential (cli/common.py) or Slurm's is not an agent's.
AGENT_PAYLOAD = "clusterwatch-agent-v1"
METADATA_KEY = "x-clusterwatch-munge"
MUNGE_TIMEOUT_S = 5.0


class MungeUnavailable(Exception):
    """No credential could be made; the message says why and what to do."""


class MungeCredentials:
    """Makes a munge credential for each stream.

    Args:
        socket: munged's socket when not the default.
        required: a stream without a credential is not opened (MungeUnavailable, the stream retries);
            otherwise a node where munge fails streams without one (the collector says if it needs one).
        binary: the munge program.
    """

    def __init__(self, socket: str | None = None, required: bool = False, binary: str = "munge") -> None:
        self.socket = socket
        self.required = required
        self.binary = binary

    async def metadata(self) -> list[tuple[str, str]]:
        """[(METADATA_KEY, credential)], or [] when munge gave none and none is required."""
        try:
            return [(METADATA_KEY, await self._make())]
        except MungeUnavailable:
            if self.required:
                raise
            return []

    async def _make(self) -> str:
        args = [self.binary, "-s", AGENT_PAYLOAD]
        if self.socket:
            args.append(f"--socket={self.socket}")
        try:
            proc = await asyncio.create_subprocess_exec(*args, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE)
        except OSError as exc:
            raise MungeUnavailable(f"cannot run {self.binary}: {exc.strerror}; install munge, or give the agent "
                                   "the collector's token (--token)") from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), MUNGE_TIMEOUT_S)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise MungeUnavailable("munged did not answer in time; is it running?") from None
        text = out.decode(errors="replace").strip()
        if proc.returncode != 0 or not text:
            reason = err.decode(errors="replace").strip() or f"{self.binary} failed"
            raise MungeUnavailable(f"no munge credential: {reason[:200]}; start munged, or give the agent the "
                                   "collector's token (--token)")
        return text


def munge_credentials(mode: str, socket: str | None) -> MungeCredentials | None:
    """What --agent-auth `mode` sends of munge: auto, where munge is installed; munge, always (required)."""
    if mode == "munge":
        return MungeCredentials(socket, required=True)
    if mode == "auto" and shutil.which("munge"):
        return MungeCredentials(socket)
    return None
