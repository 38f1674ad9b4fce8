"""What a job holds in the node's tmpfs (/dev/shm and the others): its user's files there, at the agent's last
walk (agent/tmpfs.py).

A tmpfs file belongs to a uid, not to a job: the bytes a user's files hold on a node are the host memory of
that user's running jobs on the node. With one such job (the usual case) they are its own; with two or more,
each is shown all of them, and the job view says which other jobs share them (NodeView.tmpfs_shared_with).
Pages a process maps and has touched are in its RSS as well: the figure says what the files hold, and
the job's host memory counts them once more (an overcount of the mapped part, said in docs/json.md).

Root's files are not counted for root's jobs: on a node they are the machine's (systemd's, the agents', other
suites' sockets and locks in /run and /dev/shm), not a job's, so a job run as root would be shown hundreds of
MiB it never wrote. Its tmpfs figure is None, and `status` says they are not counted (ROOT_USERS).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from clusterwatch.model import ROOT_USERS

if TYPE_CHECKING:
    from .cluster import ClusterState, JobState, NodeState

__all__ = ["MAX_USES", "job_tmpfs", "sharing_jobs", "take_tmpfs_scan"]

#: At most this many users of one walk are kept (a node has far fewer users with files in its tmpfs).
MAX_USES = 4096


def take_tmpfs_scan(ns: NodeState, scan: Any) -> None:
    """Keep an agent's walk (agent_pb2.TmpfsScan) as the node's: a user absent from it holds nothing."""
    by_user: dict[str, int] = {}
    for u in scan.uses[:MAX_USES]:
        if u.uid == 0:
            continue  # the machine's files, no job's
        name = u.user or str(u.uid)
        by_user[name] = by_user.get(name, 0) + u.bytes
    ns.tmpfs_by_user = by_user
    ns.tmpfs_at = scan.time
    ns.tmpfs_truncated = scan.truncated


def job_tmpfs(ns: NodeState | None, job: JobState | None) -> int | None:
    """What the job's user's files hold on the node's tmpfs; None before the node's first walk, for a job
    whose user is not known, and for root's jobs (not counted: root's files are the machine's)."""
    if ns is None or job is None or not ns.tmpfs_at or not job.user or job.user in ROOT_USERS:
        return None
    return ns.tmpfs_by_user.get(job.user, 0)


def sharing_jobs(state: ClusterState, node: str, job: JobState) -> list[str]:
    """The other running jobs of the job's user on the node: the same tmpfs bytes are theirs too."""
    if not job.user:
        return []
    return sorted(j.job_id for j in state.jobs.values()
                  if j is not job and not j.ended and j.user == job.user and node in j.nodes)
