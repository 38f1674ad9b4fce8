"""Who may act on a job's processes: one decision for the query service (AskTraining, `clusterwatch diagnose`)
and the web pages' actions (collector/web/access.py).

Acting (stack dumps with py-spy as root, memory snapshots, checkpoint requests, stops) reaches into a user's
process, so it needs more than seeing:

- With authenticated callers (munge on the query service; a trusted proxy's header on the web), the job's
  owner as the collector's state names it, or an operator (root, --query-admin). A job with no owner yet
  (Slurm has not answered) is the operators' alone. --show-all-jobs lets every user see every job, never act
  on another's.
- Without authentication (--query-auth none, or auto where munge is not installed) a caller is nobody in
  particular, so nobody acts, unless the collector is started with --allow-unauthenticated-actions: right
  only where whoever reaches it is the jobs' own user (`clusterwatch run` and `demo`, whose socket lies in
  a folder only their user may enter and whose page answers only that user's connections).
"""
from __future__ import annotations

from .auth import Caller, NoAuth

FLAG = "--allow-unauthenticated-actions"
NOT_OPTED_IN = ("this collector's callers are not authenticated (--query-auth none, or auto where munge is not "
                "installed), so it asks no job's processes for stacks, snapshots, checkpoints or stops; where "
                "everyone who reaches it may act on every job (one user's own collector), start it with "
                f"{FLAG}; on a cluster, use munge")


def unauthenticated(auth) -> bool:
    """Whether the query service's `auth` (query_auth's NoAuth, MungeAuth, AwaitingMunge) identifies nobody."""
    return auth is None or isinstance(auth, NoAuth)


def why_not_act(caller: Caller, owner: str, job_id: str) -> str:
    """Why an authenticated `caller` may not act on job `job_id` of `owner` ("" when it may); the owner is not
    named (whose a job is, is not the caller's business either)."""
    if caller.may_act(owner):
        return ""
    if not owner:
        return (f"job {job_id} has no known owner yet (Slurm has not said whose it is): only admins "
                "(--query-admin) may act on it")
    return f"job {job_id} is not yours: only its owner or an admin (--query-admin) may act on it"


def start_warning(allowed: bool, auth, addresses: list[str]) -> str:
    """The line the collector says at start about --allow-unauthenticated-actions ("" when nothing to say).

    `addresses`: where the query service is served; a unix: one is as private as its folder (run, demo).
    """
    if not allowed:
        return ""
    if not unauthenticated(auth):
        return f"{FLAG} has no effect: queries are authenticated (munge), so each user acts on their own jobs"
    open_to = [a for a in addresses if a and not a.startswith("unix:")]
    if not open_to:
        return ""
    return (f"{FLAG}: anyone who reaches {', '.join(open_to)} may ask every job's processes for stacks, "
            "memory snapshots, checkpoints and stops; keep it to one user's own collector, or use munge")
