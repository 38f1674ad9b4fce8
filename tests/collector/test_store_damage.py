"""A damaged store stops the collector's start with one line naming the file and what to do, never a traceback."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from clusterwatch.collector.state.cluster import JobState
from clusterwatch.collector.state.store import Store, open_db

from clusterwatch.errors import ConfigError
from tests.support.helpers import CLI

PAGE = 4096


def a_real_store(path: Path) -> None:
    """A store with a few hundred jobs and summaries, checkpointed into the file and closed."""
    conn = open_db(str(path))
    store = Store(conn)
    for i in range(300):
        store.save_job(JobState(str(i), name="train-" * 30, user="alice"))
        store.save_summary(str(i), b"view" * 800)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def damage_pages(path: Path, pages=range(3, 8)) -> None:
    data = bytearray(path.read_bytes())
    assert len(data) > 8 * PAGE
    for page in pages:
        data[page * PAGE:page * PAGE + 100] = b"\xff" * 100
    path.write_bytes(data)


def start_collector(db: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "collector", "--db", str(db), "--listen", "127.0.0.1:0",
                           "--metrics-listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=60)


def test_a_damaged_page_stops_the_start_with_one_line(tmp_path: Path) -> None:
    db = tmp_path / "cw.db"
    a_real_store(db)
    damage_pages(db)
    done = start_collector(db)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert str(db) in lines[0] and "damaged" in lines[0] and "move it away" in lines[0]
    with pytest.raises(ConfigError, match="damaged"):
        open_db(str(db))


def test_a_file_that_is_no_database_stops_the_start_with_one_line(tmp_path: Path) -> None:
    db = tmp_path / "cw.db"
    db.write_bytes(b"this is not SQLite" * 1000)
    done = start_collector(db)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(db) in lines[0] and "move the broken file away" in lines[0]


def test_a_sound_store_opens(tmp_path: Path) -> None:
    db = tmp_path / "cw.db"
    a_real_store(db)
    assert len(Store(open_db(str(db))).load_jobs()) == 300
