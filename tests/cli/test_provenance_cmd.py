"""`clusterwatch provenance`: a directory or a process, human and JSON, as root read as its owner."""
from __future__ import annotations

import json
import logging
import os
import stat

from click.testing import CliRunner
from clusterwatch.agent.provenance import (
    ProvenanceConfig,
    provenance_of_dir,
)
from clusterwatch.cli.provenance_cmd import provenance as provenance_cmd

from tests.support.git_repos import (
    NOBODY,
    TOKEN,
    chown_tree,
    git,
    make_repo,
)


def test_remote_token_appears_in_no_output(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    repo = make_repo(tmp_path / "r")
    git(repo, "remote", "add", "origin", f"https://oauth2:{TOKEN}@git.example.org/team/r.git")
    git(repo, "remote", "add", "mirror", "git@github.com:team/r.git")
    rec = provenance_of_dir(str(repo))
    assert rec.git.remote_url == "https://git.example.org/team/r.git"
    assert TOKEN not in rec.to_json() and TOKEN not in repr(rec)
    result = CliRunner().invoke(provenance_cmd, [str(repo)])
    json_result = CliRunner().invoke(provenance_cmd, [str(repo), "--json"])
    assert result.exit_code == 0 and json_result.exit_code == 0
    assert "https://git.example.org/team/r.git" in result.output
    assert json.loads(json_result.output)["git"]["remote_url"] == "https://git.example.org/team/r.git"
    # a failure that makes git print the URL must not leak it either
    (repo / ".git" / "config").write_text((repo / ".git" / "config").read_text() + "[broken\n")
    broken = provenance_of_dir(str(repo))
    assert broken.git.error
    for text in (result.output, json_result.output, broken.to_json(), caplog.text):
        assert TOKEN not in text


def test_no_git_binary_says_unknown(tmp_path, monkeypatch, caplog):
    repo = make_repo(tmp_path / "r")
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    rec = provenance_of_dir(str(repo))
    assert rec.git.commit == "unknown" and "no git binary" in rec.git.error
    assert rec.git.ran_as_uid is None
    assert "no git binary" in caplog.text
    rec2 = provenance_of_dir(str(repo), ProvenanceConfig(git="/nonexistent/git"))
    assert "no git binary" in rec2.git.error
    result = CliRunner().invoke(provenance_cmd, [str(repo)])
    assert result.exit_code == 0 and "unknown" in result.output


def test_cli_human_and_json(tmp_path):
    repo = make_repo(tmp_path / "r")
    (repo / "README").write_text("changed\n")
    human = CliRunner().invoke(provenance_cmd, [str(repo)])
    assert human.exit_code == 0
    head = git(repo, "rev-parse", "HEAD")
    assert f"commit      {head}" in human.output and "modified tracked files" in human.output
    doc = json.loads(CliRunner().invoke(provenance_cmd, [str(repo), "--json"]).output)
    assert doc["git"]["commit"] == head and doc["git"]["dirty"] is True and doc["source"] == "dir"
    assert doc["version"] == 1 and len(doc["code_id"]) == 16
    # a directory has no process: null, as status --json writes a record's missing values, never 0.0 or ""
    assert doc["pid"] is None and doc["start_time"] is None and doc["error"] is None and doc["git"]["error"] is None


def test_cli_as_root_reads_a_directory_as_its_owner(shared_dir):
    repo = make_repo(shared_dir / "r")
    chown_tree(repo, NOBODY)
    doc = json.loads(CliRunner().invoke(provenance_cmd, [str(repo), "--json"]).output)
    assert doc["git"]["ran_as_uid"] == NOBODY and doc["uid"] == NOBODY and doc["git"]["error"] is None
    assert stat.S_IMODE(os.stat(shared_dir).st_mode) == 0o755
