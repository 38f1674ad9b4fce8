"""A job's summary file (--summary-dir) holds its owner, command line and provenance: the collector's alone."""
from __future__ import annotations

import os
import stat
from pathlib import Path

from clusterwatch.collector.state.summary import write_summary
from clusterwatch.v1 import query_pb2


def view(job_id: str) -> query_pb2.JobView:
    v = query_pb2.JobView()
    v.job.job_id = job_id
    v.job.user = "alice"
    v.provenance_json = '[{"cmdline": ["python", "train.py", "--secret-path", "/home/alice/data"]}]'
    return v


def mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_summary_is_written_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = write_summary(str(tmp_path), view("42"))
    finally:
        os.umask(old)
    assert mode(path) == 0o600


def test_a_summary_rewritten_over_an_older_readable_one_is_private(tmp_path: Path) -> None:
    older = tmp_path / "clusterwatch-43.json"
    older.write_text("{}")
    older.chmod(0o644)
    path = write_summary(str(tmp_path), view("43"))
    assert path == str(older) and mode(path) == 0o600
    assert "train.py" in older.read_text()
