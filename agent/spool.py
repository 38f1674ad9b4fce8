"""Job events left by the Slurm prolog and epilog, picked up by the agent.

The hooks must return within a second with the agent down, so they never talk to
the agent directly: each writes one small JSON file into `<spool>/events/` (written
to a temporary name, then renamed, so the agent never reads half a file). The agent
reads and removes them on its next poll; files written while it was down wait for it.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import replace

from clusterwatch.model import GpuInfo, JobEvent

log = logging.getLogger("clusterwatch.agent")

#: Parent of the per-node spool folders when no spool folder is configured.
SPOOL_ROOT = "/run/clusterwatch"


def spool_dir_for(value: str | None, node: str) -> str:
    """The spool folder of ``node``: its events, the agent's pid file and the start lock live there.

    Several slurmd can run on one host (``slurmd -N n1``, ``-N n2``), each with its own agent, so the
    default is one folder per node, ``/run/clusterwatch/<node>``; a configured value may say where that
    node's name goes with ``{node}``.

    Args:
        value: the configured folder (flag, CLUSTERWATCH_SPOOL, ``[agent] spool_dir``); None or empty for
            the default.
        node: the node name.

    Returns:
        The folder path (not created).
    """
    if not value:
        return os.path.join(SPOOL_ROOT, node)
    return value.replace("{node}", node)


def resolve_gpus(indexes: str, inventory: Sequence[GpuInfo]) -> tuple[str, ...]:
    """Turn the GPU list a prolog saw (``SLURM_JOB_GPUS``/``CUDA_VISIBLE_DEVICES``) into GPU UUIDs.

    Slurm gives per-node indexes (``0,2``) and, with ``AutoDetect=nvml``, numbers GPUs as NVML does; a
    CUDA_VISIBLE_DEVICES entry may also be a UUID or a unique UUID prefix. With MIG, Slurm makes each
    MIG instance a GPU of its own: CUDA_VISIBLE_DEVICES holds the instances' ``MIG-…`` UUIDs (exact),
    and SLURM_JOB_GPUS Slurm's own device numbers, which count the instances in NVML order (a GPU's
    instances in place of the GPU) -- the order of the inventory, not the NVML index the instances
    share with their parent. Entries that match no GPU of the inventory are dropped: a GPU is only
    ever named by its UUID.

    Args:
        indexes: comma-separated entries as the hook read them.
        inventory: the agent's GPUs, in NVML order (MIG instances in their parent's place).

    Returns:
        The UUIDs, in the order given, without repeats.
    """
    if any(g.uuid.startswith("MIG-") for g in inventory):
        by_index = {number: g.uuid for number, g in enumerate(inventory)}
    else:
        by_index = {g.index: g.uuid for g in inventory}
    found: list[str] = []
    for raw in indexes.split(","):
        entry = raw.strip()
        if entry.isdigit():
            uuid = by_index.get(int(entry))
        elif entry:
            matches = [g.uuid for g in inventory if g.uuid.startswith(entry)]
            uuid = matches[0] if len(matches) == 1 else None
        else:
            uuid = None
        if uuid is not None and uuid not in found:
            found.append(uuid)
    return tuple(found)


def with_gpu_uuids(event: JobEvent, inventory: Sequence[GpuInfo]) -> JobEvent:
    """The event with its GPU indexes resolved to UUIDs, unless it already names UUIDs."""
    if event.gpu_uuids or not event.gpu_indexes:
        return event
    return replace(event, gpu_uuids=resolve_gpus(event.gpu_indexes, inventory))


def write_event(spool_dir: str, event: JobEvent) -> str:
    """Write a job event file atomically, 0600; return its path. Raises OSError when it cannot, SpoolNotPrivate
    when another user owns the spool folder (the agent would not read it)."""
    from .ensure import open_private, private_folder

    private_folder(spool_dir)
    events = os.path.join(spool_dir, "events")
    private_folder(events)
    name = f"{event.time:.6f}-{event.job_id}-{event.kind}-{os.getpid()}.json"
    doc = {
        "kind": event.kind,
        "job_id": event.job_id,
        "time": event.time,
        "uid": event.uid,
        "user": event.user,
        "gpu_uuids": list(event.gpu_uuids),
        "gpu_indexes": event.gpu_indexes,
        "exit_code": event.exit_code,
    }
    tmp = os.path.join(events, f".{name}.tmp")
    with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_TRUNC), "w") as f:
        json.dump(doc, f)
    final = os.path.join(events, name)
    os.replace(tmp, final)
    return final


def parse_event(text: str) -> JobEvent:
    """Parse one event file; raises ValueError on anything malformed."""
    doc = json.loads(text)
    if not isinstance(doc, dict) or doc.get("kind") not in ("start", "end"):
        raise ValueError("kind must be 'start' or 'end'")
    job_id = str(doc.get("job_id", ""))
    if not job_id or len(job_id) > 64:
        raise ValueError("job_id missing or too long")
    exit_code = doc.get("exit_code")
    return JobEvent(
        kind=doc["kind"],
        job_id=job_id,
        time=float(doc.get("time", 0.0)),
        uid=int(doc.get("uid", 0)),
        user=str(doc.get("user", "")),
        gpu_uuids=tuple(str(u) for u in doc.get("gpu_uuids", ())),
        gpu_indexes=str(doc.get("gpu_indexes", "")),
        exit_code=int(exit_code) if exit_code is not None else None,
    )


class JobSpool:
    """The agent's side of the spool: pending events, and the jobs running on this node.

    Args:
        spool_dir: the folder the hooks write into.
        find_job_pids: given the running job ids, the pids of their processes on this node
            (from cgroups); None when the node has no Slurm.
    """

    def __init__(self, spool_dir: str, find_job_pids: Callable[[set[str]], set[int]] | None = None) -> None:
        self.dir = os.path.join(spool_dir, "events")
        self.find_job_pids = find_job_pids
        self.running: dict[str, JobEvent] = {}
        self.rejected = 0

    def take_events(self) -> list[JobEvent]:
        """Read, remove and return the pending events, oldest first."""
        try:
            names = sorted(n for n in os.listdir(self.dir) if n.endswith(".json"))
        except FileNotFoundError:
            return []
        except OSError as exc:
            self.rejected += 1
            log.debug("cannot list %s: %s", self.dir, exc)
            return []
        events = []
        for name in names:
            path = os.path.join(self.dir, name)
            try:
                with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)) as f:
                    owner = os.fstat(f.fileno()).st_uid
                    if owner not in (0, os.geteuid()):  # a job event names a job's owner: only the hooks' say
                        raise ValueError(f"written by uid {owner}, not by root or this agent's user")
                    text = f.read(65536)
                event = parse_event(text)
            except (OSError, ValueError, TypeError) as exc:
                self.rejected += 1
                log.warning("ignoring malformed job event %s: %s", path, exc)
                self._remove(path)
                continue
            self._remove(path)
            if event.kind == "start":
                self.running[event.job_id] = event
            else:
                self.running.pop(event.job_id, None)
            events.append(event)
        return events

    def job_pids(self) -> set[int]:
        """Pids of the running jobs' processes on this node (empty without a finder)."""
        if not self.running or self.find_job_pids is None:
            return set()
        return self.find_job_pids(set(self.running))

    @staticmethod
    def _remove(path: str) -> None:
        try:
            os.unlink(path)
        except OSError:
            pass
