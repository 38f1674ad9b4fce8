"""Job labels: looked up once per process (pid, start time), inherited down the tree, the same every poll."""
from __future__ import annotations

from clusterwatch.agent.labels import JobLabeler, JobLabels

from clusterwatch.model import ProcessSample


def sample(pid: int, ppid: int, start: float = 1.0, t: float = 0.0) -> ProcessSample:
    return ProcessSample(t, "n", pid, start, ppid)


class Lookup:
    """Slurm labels by pid, counting the lookups."""

    def __init__(self, labels: dict[int, JobLabels]) -> None:
        self.labels = labels
        self.calls: list[int] = []

    def __call__(self, pid: int) -> JobLabels | None:
        self.calls.append(pid)
        return self.labels.get(pid)


def labels_of(samples: list[ProcessSample]) -> dict[int, tuple]:
    return {s.pid: (s.job_id, s.rank, s.local_rank, s.step_id, s.mapped_by) for s in samples}


def test_each_process_is_looked_up_once_and_labelled_every_poll() -> None:
    rank = JobLabels("42", rank=3, local_rank=1, step_id="0", mapped_by="env")
    lookup = Lookup({10: rank, 30: JobLabels("43", mapped_by="cgroup")})
    labeler = JobLabeler({}, slurm_lookup=lookup)
    # 11 (a data loader worker of rank 3) comes before its parent: the parent is looked up through it
    polls = [[sample(11, 10, t=t), sample(10, 1, t=t), sample(20, 1, t=t)] for t in range(3)]
    firsts = [labeler.label(poll) for poll in polls]
    # the first poll looks every process up; later ones return the one labelled through its parent only
    assert sorted(s.pid for s in firsts[0]) == [10, 11, 20]
    assert [[s.pid for s in first] for first in firsts[1:]] == [[11], [11]]
    assert sorted(lookup.calls) == [10, 11, 20]
    for poll in polls:
        assert labels_of(poll) == {10: ("42", 3, 1, "0", "env"), 11: ("42", 3, 1, "0", "env"),
                                   20: ("", None, None, "", "")}
    # 20's parent becomes watched: 20 is labelled through it from now on, and says so
    poll = [sample(11, 10), sample(10, 1), sample(20, 30), sample(30, 1)]
    assert sorted(s.pid for s in labeler.label(poll)) == [11, 20, 30]
    assert labels_of(poll)[20] == ("43", None, None, "", "cgroup")
    assert sorted(lookup.calls) == [10, 11, 20, 30]


def test_a_reused_pid_is_looked_up_anew_and_gone_processes_are_forgotten() -> None:
    lookup = Lookup({10: JobLabels("42", mapped_by="env")})
    labeler = JobLabeler({}, slurm_lookup=lookup)
    labeler.label([sample(10, 1), sample(20, 1)])
    lookup.labels = {10: JobLabels("43", mapped_by="cgroup")}
    later = [sample(10, 1, start=5.0)]  # pid 10 is another process now; 20 has exited
    assert labeler.label(later) == later
    assert labels_of(later) == {10: ("43", None, None, "", "cgroup")}
    assert lookup.calls == [10, 20, 10]
    assert labeler.label([sample(20, 1)]) != []  # forgotten when it left: a new sight
    assert lookup.calls == [10, 20, 10, 20]


def test_watched_roots_carry_their_job_to_their_tree() -> None:
    labeler = JobLabeler({5: (1.0, "local-5")}, local_lookup=lambda pid, job: JobLabels(job, rank=0, mapped_by="pid"))
    poll = [sample(5, 1), sample(6, 5), sample(7, 6)]
    labeler.label(poll)
    assert labels_of(poll) == {5: ("local-5", 0, None, "", "pid"), 6: ("local-5", 0, None, "", "tree"),
                               7: ("local-5", 0, None, "", "tree")}


def test_a_process_given_a_watched_roots_pid_is_not_the_root() -> None:
    """The root (pid 5, started at 1.0) exited; pid 5 went to another process (started at 9.0) with a child."""
    labeler = JobLabeler({5: (1.0, "local-5")}, local_lookup=lambda pid, job: JobLabels(job, rank=0, mapped_by="pid"))
    root = [sample(5, 1, start=1.0)]
    labeler.label(root)
    assert labels_of(root)[5][0] == "local-5"
    reused = [sample(5, 1, start=9.0), sample(6, 5, start=9.5)]
    labeler.label(reused)
    assert labels_of(reused) == {5: ("", None, None, "", ""), 6: ("", None, None, "", "")}
