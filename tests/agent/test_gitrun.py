"""agent/gitrun.py: git run with the repository owner's identity and no driver of the repository's."""
from __future__ import annotations

from clusterwatch.agent.gitrun import GitRunner, RunAs, driver_overrides

from tests.git_repos import (
    NOBODY,
    git_wrapper,
)


def test_driver_overrides_cover_every_defined_driver_even_odd_names():
    names = ["core.bare", "filter.lfs.clean", "filter.lfs.smudge", "filter.a=b.c.process",
             "diff.tool.textconv", "diff.external", "diff.submodule", "FILTER.Up.clean"]
    got = dict(driver_overrides(names))
    assert got["filter.lfs.clean"] == "" and got["filter.lfs.process"] == ""
    assert got["filter.lfs.required"] == "false"
    assert got["filter.a=b.c.process"] == "" and got["filter.a=b.c.clean"] == ""
    assert got["filter.Up.clean"] == ""
    assert got["diff.tool.textconv"] == "" and got["diff.tool.command"] == ""
    assert "diff.external.textconv" not in got and "diff..textconv" not in got


def test_git_runner_never_keeps_roots_groups(shared_dir):
    wrapper, log = git_wrapper(shared_dir)
    runner = GitRunner(RunAs(NOBODY, NOBODY, ()), git=str(wrapper))
    runner.run(["version"], "/")
    entries = log.read_text().split()
    assert entries[:2] == [str(NOBODY), str(NOBODY)]  # uid, then the only group
    assert "HOME=/nonexistent" in log.read_text()
