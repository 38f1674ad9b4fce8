"""clusterwatch/git_safety.py: the settings that keep a repository's config from running anything, for the
agent and training code alike."""
from clusterwatch.git_safety import driver_overrides


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
