"""Which Slurm job, step and task a process belongs to, from ``/proc/<pid>/cgroup`` and ``environ``.

Pure functions over the files' contents (environ is split by clusterwatch.procfs); reading them is the
caller's business (and races with the process exiting, which the caller counts).

cgroup v2 (one line ``0::<path>``), with proctrack/cgroup::

    /system.slice/slurmstepd.scope/job_123/step_0/user/task_0
    /system.slice/n1_slurmstepd.scope/job_123/step_batch/slurm        (several slurmd on one host)
    /system.slice/slurmstepd.scope/s5K1KKYAYG5D00/step_0/user/task_1   (Slurm 26.05: the job's SLUID)

cgroup v1 (one line per controller ``N:controllers:<path>``)::

    /slurm/uid_1000/job_123/step_0/task_0
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from clusterwatch.errors import ParseError
from clusterwatch.procfs import parse_environ as parse_environ  # re-exported: the one parser of environ


@dataclass(frozen=True)
class CgroupJob:
    """What a process's cgroup path says about its Slurm job.

    Attributes:
        job_id: numeric job id, None when the path holds a SLUID instead (Slurm 26.05+).
        sluid: the job's SLUID (``s5K1KKYAYG5D00``), None for ``job_<id>`` paths.
        step: ``0``, ``batch``, ``extern``, ``interactive``...; None when the path stops at the job.
        task: task number on the node (``task_3`` → 3), None for ``slurm``/``task_special``/no task.
        uid: the job owner's uid (cgroup v1 ``uid_<n>``), None on v2.
        node: the node name prefix of ``<node>_slurmstepd.scope`` (several slurmd on one host), else None.
    """

    job_id: int | None
    sluid: str | None
    step: str | None
    task: int | None
    uid: int | None = None
    node: str | None = None


# SLUIDs: "s" and 13 upper-case letters or digits (base32), e.g. s5K1KKYAYG5D00.
_SLUID = r"s[0-9A-Z]{13}"
_V2 = re.compile(
    r"/(?:(?P<node>[^/]+)_)?slurmstepd\.scope/"
    rf"(?:job_(?P<job>\d+)|(?P<sluid>{_SLUID}))"
    r"(?:/step_(?P<step>[^/]+))?"
    r"(?:/user/task_(?P<task>\d+|special))?"
)
_V1 = re.compile(
    r"/slurm(?:_(?P<node>[^/]+))?/uid_(?P<uid>\d+)/job_(?P<job>\d+)"
    r"(?:/step_(?P<step>[^/]+))?"
    r"(?:/task_(?P<task>\d+|special))?"
)


def parse_cgroup(text: str) -> CgroupJob | None:
    """Find the Slurm job in the text of ``/proc/<pid>/cgroup``.

    Args:
        text: the file's content (v1, v2 or hybrid).

    Returns:
        The job, step and task, or None when the process is not in a Slurm job's cgroup.

    Raises:
        ParseError: a line that is not ``hierarchy:controllers:path``.
    """
    if not isinstance(text, str):
        raise ParseError(f"cgroup file must be text, not {type(text).__name__}")
    v1_hit: CgroupJob | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[0].isdigit():
            raise ParseError(f"cgroup line {line[:60]!r} is not hierarchy:controllers:path")
        path = parts[2]
        match = _V2.search(path)
        if match is not None:
            # The unified hierarchy is authoritative on v2 and hybrid systems.
            return _from_match(match, v2=True)
        if v1_hit is None:
            match = _V1.search(path)
            if match is not None:
                v1_hit = _from_match(match, v2=False)
    return v1_hit


def _from_match(match: re.Match[str], v2: bool) -> CgroupJob:
    groups = match.groupdict()
    task = groups.get("task")
    return CgroupJob(
        job_id=int(groups["job"]) if groups.get("job") else None,
        sluid=groups.get("sluid") if v2 else None,
        step=groups.get("step"),
        task=int(task) if task is not None and task.isdigit() else None,
        uid=int(groups["uid"]) if not v2 and groups.get("uid") else None,
        node=groups.get("node"),
    )


@dataclass(frozen=True)
class EnvLabels:
    """Job and rank labels a process's environment carries (None when the variable is absent or bad).

    Attributes:
        job_id: SLURM_JOB_ID.
        step_id: SLURM_STEP_ID (text: ``0``, ``batch``...; srun tasks have a number).
        proc_id: SLURM_PROCID, the global task rank.
        local_id: SLURM_LOCALID, the rank on the node.
        rank: RANK (torchrun, accelerate...).
        local_rank: LOCAL_RANK.
        world_size: WORLD_SIZE.
        job_gpus: SLURM_JOB_GPUS as given (e.g. ``0,1``).
        cuda_visible_devices: CUDA_VISIBLE_DEVICES as given.
    """

    job_id: int | None = None
    step_id: str | None = None
    proc_id: int | None = None
    local_id: int | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    job_gpus: str | None = None
    cuda_visible_devices: str | None = None


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    # A malformed value is someone else's bug: no label rather than an exception in the sampling loop.
    return int(value) if value.isdigit() else None


def environ_labels(env: Mapping[str, str]) -> EnvLabels:
    """Pick the Slurm and launcher rank variables out of a process environment.

    Args:
        env: as returned by :func:`parse_environ`.

    Returns:
        The labels found.
    """
    return EnvLabels(
        job_id=_env_int(env, "SLURM_JOB_ID") if "SLURM_JOB_ID" in env else _env_int(env, "SLURM_JOBID"),
        step_id=env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or None,
        proc_id=_env_int(env, "SLURM_PROCID"),
        local_id=_env_int(env, "SLURM_LOCALID"),
        rank=_env_int(env, "RANK"),
        local_rank=_env_int(env, "LOCAL_RANK"),
        world_size=_env_int(env, "WORLD_SIZE"),
        job_gpus=env.get("SLURM_JOB_GPUS") or None,
        cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES") or None,
    )
