"""The store is the collector's alone: made private (0600 files, a 0700 folder), and a store the collector
cannot write (read-only, or locked by another process) stops its start with one line, never a traceback."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from clusterwatch.collector.state.cluster import JobState
from clusterwatch.collector.state.store import Store, open_db

from tests.support.helpers import CLI, clean_environ

# Root without capabilities: the mode bits bind it as they bind any user (no CAP_DAC_OVERRIDE).
NO_CAPABILITIES = ["setpriv", "--bounding-set=-all", "--"]

HOLD_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
conn.execute("CREATE TABLE IF NOT EXISTS held (x)")
print("held", flush=True)
time.sleep(120)
"""


def a_store(path: Path) -> None:
    conn = open_db(str(path))
    Store(conn).save_job(JobState("1", name="train", user="alice"))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def start_collector(db: Path, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, *CLI, "collector", "--db", str(db), "--listen", "127.0.0.1:0",
                           "--metrics-listen", "127.0.0.1:0", "--query-auth", "none"],
                          capture_output=True, text=True, timeout=60, env=clean_environ())


def one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    return lines[0]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_read_only_store_stops_the_start_with_one_line(tmp_path: Path) -> None:
    db = tmp_path / "cw.db"
    a_store(db)
    db.chmod(0o400)
    line = one_line(start_collector(db, tuple(NO_CAPABILITIES)))
    assert str(db) in line and "read-only" in line and "--db" in line, line


def test_a_store_in_a_read_only_folder_stops_the_start_with_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    folder.mkdir()
    db = folder / "cw.db"
    a_store(db)
    folder.chmod(0o500)
    try:
        line = one_line(start_collector(db, tuple(NO_CAPABILITIES)))
    finally:
        folder.chmod(0o700)
    assert str(db) in line and "--db" in line and "broken" not in line, line


def test_a_store_locked_by_another_process_stops_the_start_with_one_line(tmp_path: Path) -> None:
    db = tmp_path / "cw.db"
    a_store(db)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        line = one_line(start_collector(db))
    finally:
        holder.kill()
        holder.wait()
    assert str(db) in line and "locked by another process" in line, line
    assert "broken" not in line and "damaged" not in line, line


def test_a_new_store_its_wal_and_its_folder_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)  # a shell's usual umask: the modes must not depend on the caller's
    try:
        db = tmp_path / "state" / "cw.db"
        conn = open_db(str(db))
        Store(conn).save_job(JobState("1", name="train", user="alice"))
        files = [db, Path(f"{db}-wal"), Path(f"{db}-shm")]
        assert all(f.exists() for f in files)
        assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}
        assert mode(db.parent) == 0o700
        conn.close()
    finally:
        os.umask(old)


def test_an_existing_store_readable_by_others_is_made_private(tmp_path: Path) -> None:
    db = tmp_path / "cw.db"
    a_store(db)
    db.chmod(0o644)
    os.umask(old := os.umask(0o022))
    try:
        conn = open_db(str(db))
        Store(conn).save_job(JobState("2", name="train", user="bob"))
        for f in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
            assert mode(f) == 0o600, f
        conn.close()
    finally:
        os.umask(old)


def test_a_real_collector_makes_its_store_private(tmp_path: Path) -> None:
    from tests.support.helpers import Collector

    db = tmp_path / "state" / "cw.db"
    db.parent.mkdir(mode=0o700)  # an explicit --db's folder is never made by the collector (a mistyped path)
    collector = Collector(tmp_path, db=db)
    try:
        assert mode(db) == 0o600 and mode(db.parent) == 0o700
        made = list(db.parent.iterdir())
        assert Path(f"{db}-wal") in made
        assert {f.name: mode(f) & 0o077 for f in made} == {f.name: 0 for f in made}
    finally:
        collector.stop()


def test_a_folder_named_as_the_store_keeps_its_mode(tmp_path: Path) -> None:
    """--db naming a shared folder (a mistyped /tmp) must not take its bits away: others lose /tmp otherwise."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    try:
        open_db(str(shared))
    except Exception:  # SQLite cannot open a folder: what it says is the CLI's concern, the mode is ours
        pass
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
