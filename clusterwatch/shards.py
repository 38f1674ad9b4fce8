"""Which collector holds a job, and which holds a node's own series: rendezvous hashing over one list.

A deployment lists its collectors in one order, everywhere (the config file's `collectors = [...]`, or
`--collector a,b,c`). A job belongs to the collector with the highest weight for its job id, a node's own
series (its GPUs, node memory, processes of no job) to the one with the highest weight for its node name.
Rendezvous (highest random weight) hashing moves only the keys of a collector that is added or removed,
about 1/N of them, and needs no ring or table that could differ between hosts.

The weight is blake2b of collector and key: Python's hash() of a str is salted per process, and the
agent, the collectors and the CLI must agree across hosts and restarts.

A running job stays where it started when the list changes. Nobody has to remember it: Slurm numbers
jobs in the order they are submitted, so a change carries the first job id of the new list
(`collectors_before = {job = N, collectors = [...]}` keeps the old list for the jobs numbered below N).
Agents, collectors and the CLI compute the same answer from the same two lists, with no redirect and no
state; once the last job below N has ended the operator drops `collectors_before`. A job id that is not
a Slurm number (a `clusterwatch run` job) always uses the current list.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

# A Slurm job id: the number, then an array task (_7) or a heterogeneous component (+1) of that job.
_SLURM_JOB = re.compile(r"^(\d+)(?:[_+].*)?$")


class ShardError(ValueError):
    """A collectors list that cannot be used (empty, a member twice, an empty member)."""


def weight(collector: str, key: str) -> int:
    """The rendezvous weight of `key` on `collector`: stable across processes, hosts and Python versions."""
    digest = hashlib.blake2b(f"{collector}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def pick(key: str, collectors: tuple[str, ...]) -> str:
    """The collector with the highest weight for `key` (ties, astronomically rare, go to the earlier one)."""
    if not collectors:
        raise ShardError("the collectors list is empty")
    best = collectors[0]
    best_w = weight(best, key)
    for c in collectors[1:]:
        w = weight(c, key)
        if w > best_w:
            best, best_w = c, w
    return best


def parse_list(text: str | list | tuple, what: str = "--collector") -> tuple[str, ...]:
    """`a:1,b:2` (or a list of strings) as a tuple; ShardError for an empty list, member, or a duplicate."""
    items = [s.strip() for s in text.split(",")] if isinstance(text, str) else [str(s).strip() for s in text]
    if not items or all(not s for s in items):
        raise ShardError(f"{what} lists no collector; give HOST:PORT, or several comma-separated")
    if any(not s for s in items):
        raise ShardError(f"{what} {','.join(items)!r} has an empty entry; separate addresses with one comma")
    seen: set[str] = set()
    for s in items:
        if s in seen:
            raise ShardError(f"{what} lists {s} twice; each collector once, in the same order everywhere")
        seen.add(s)
    return tuple(items)


def slurm_job_number(job_id: str) -> int | None:
    """The Slurm job number of `job_id` (4242 of 4242, 4242_7, 4242+1), None when it is not a Slurm id."""
    m = _SLURM_JOB.match(job_id.strip())
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Collectors:
    """The deployment's collectors: the current list, and the list of the jobs that started before it.

    `before_job`: the first job number of `current`; jobs numbered below it use `previous`.
    """
    current: tuple[str, ...]
    previous: tuple[str, ...] = ()
    before_job: int = 0

    @classmethod
    def parse(cls, current: str | list | tuple, before: str | None = None) -> "Collectors":
        """From `--collector a,b,c` and `--collectors-before N=a,b` (empty: no earlier list)."""
        cur = parse_list(current)
        if not before:
            return cls(cur)
        job, sep, members = before.partition("=")
        if not sep or not job.strip().isdigit():
            raise ShardError(f"--collectors-before {before!r} is not JOB=HOST:PORT,...: the first job number of "
                             "the current list, then the earlier list")
        return cls(cur, parse_list(members, "--collectors-before"), int(job))

    @property
    def all(self) -> tuple[str, ...]:
        """Every collector that may hold something: the current list, then those only the earlier one has."""
        return self.current + tuple(c for c in self.previous if c not in self.current)

    def list_for_job(self, job_id: str) -> tuple[str, ...]:
        n = slurm_job_number(job_id)
        if self.previous and n is not None and n < self.before_job:
            return self.previous
        return self.current

    def for_job(self, job_id: str) -> str:
        """The collector that holds `job_id`'s samples, alerts and status."""
        return pick(job_id.strip(), self.list_for_job(job_id))

    def for_node(self, node: str) -> str:
        """The collector that holds `node`'s own series (always the current list: they have no start)."""
        return pick(node, self.current)
