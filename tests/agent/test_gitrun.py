"""agent/gitrun.py: git run with the repository owner's identity and no driver of the repository's."""
from __future__ import annotations

from clusterwatch.agent.gitrun import GitRunner, RunAs

from tests.support.git_repos import (
    NOBODY,
    git_wrapper,
)


def test_git_runner_never_keeps_roots_groups(shared_dir):
    wrapper, log = git_wrapper(shared_dir)
    runner = GitRunner(RunAs(NOBODY, NOBODY, ()), git=str(wrapper))
    runner.run(["version"], "/")
    entries = log.read_text().split()
    assert entries[:2] == [str(NOBODY), str(NOBODY)]  # uid, then the only group
    assert "HOME=/nonexistent" in log.read_text()
