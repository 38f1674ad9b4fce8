"""What must survive a collector restart, in SQLite: nodes, jobs, job summaries, provenance.

Samples stay in memory (bounded history); the store holds the few rows that change
when a job or node changes, and each ended job's final view, so `status` still shows
a job after it ended and after the collector restarted. Alerts have their own table,
owned by collector/alerting/alerts.py, in the same database.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import sqlite3
import stat
import time
from contextlib import contextmanager
from typing import NamedTuple

from clusterwatch.errors import ConfigError

from .cluster import GpuUseTotals, JobState

SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    node TEXT PRIMARY KEY,
    boot_id TEXT NOT NULL,
    agent_version TEXT NOT NULL,
    memory_total_bytes INTEGER NOT NULL,
    gpus TEXT NOT NULL,            -- JSON list of GPU UUIDs
    last_seen REAL NOT NULL        -- Unix seconds
);
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    info TEXT NOT NULL,            -- JSON of the job's fields (JobState without processes)
    state TEXT NOT NULL,
    user TEXT NOT NULL,
    start_time REAL NOT NULL,
    end_time REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS job_summaries (
    job_id TEXT PRIMARY KEY,
    view BLOB NOT NULL,            -- the final clusterwatch.v1.JobView, serialised
    written REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS node_counts (
    node TEXT PRIMARY KEY,
    counts TEXT NOT NULL,          -- JSON [[pid, start_time, samples, cpu_seconds, first_time], ...]: samples
                                   -- stored (and acknowledged), CPU time and first sample (older rows: 3 items)
                                   -- of each live process of the node; one row a node keeps the flush cheap
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS stream_seqs (
    boot_id TEXT PRIMARY KEY,      -- one agent instance
    low INTEGER NOT NULL,          -- every batch number up to this one is stored
    above TEXT NOT NULL,           -- JSON list of stored numbers above low
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS provenance (
    job_id TEXT NOT NULL,
    node TEXT NOT NULL,
    pid INTEGER NOT NULL,
    start_time REAL NOT NULL,
    record TEXT NOT NULL,          -- JSON provenance record
    PRIMARY KEY (job_id, node, pid, start_time)
);
"""

# An agent instance still running resends what was not acknowledged, however long it was cut off, and its
# batch numbers are what drops the duplicates: they are forgotten only after a week without a word from it
# (while the collector ran: see CollectorCore._forget_stale).
STALE_AFTER_S = 7 * 86400.0

_JOB_FIELDS = (
    "name", "user", "account", "partition", "state", "submit_time", "start_time", "end_time",
    "time_limit_s", "nodes", "cpus", "memory_bytes", "gpus", "gpus_by_node", "source", "ranks_expected",
    "note", "exit_code", "tags", "qos", "cluster",
)


# The rows that cross the store's boundary, named (issue 25 item 5): the core, durability and job closing
# build them, the store writes them; what the store reads back comes as these too.


class JobRow(NamedTuple):
    """A job as the jobs table holds it (without `updated`)."""

    job_id: str
    info: str  # JSON: the job's _JOB_FIELDS and its GPU totals
    state: str
    user: str
    start_time: float
    end_time: float


class NodeRow(NamedTuple):
    """A node as the nodes table holds it (save_node's arguments)."""

    node: str
    boot_id: str
    agent_version: str
    memory_total_bytes: int
    gpus: list[str]  # UUIDs
    last_seen: float


class ProvenanceRow(NamedTuple):
    """A process's provenance record as the provenance table holds it."""

    job_id: str
    node: str
    pid: int
    start_time: float
    record: str  # JSON (agent/provenance/record.py)


class NodeSeen(NamedTuple):
    """When a node's agent was last heard of."""

    node: str
    last_seen: float


class JobEnd(NamedTuple):
    """A stored job that ended, and when."""

    job_id: str
    end_time: float


class StreamSeqs(NamedTuple):
    """The batch numbers stored of an agent instance (its boot id): all up to `low`, and those in `above`."""

    boot_id: str
    low: int
    above: list[int]


def job_row(job: JobState) -> JobRow:
    """A job as the jobs table holds it (without `updated`)."""
    # Read by name, not through asdict(job): that deep-copies the whole job first (its processes, provenance,
    # costs), for every running job at every flush; these fields are plain values, lists and dicts, which
    # json.dumps writes as it would their copies, in the same order (the dataclass's).
    info = {k: getattr(job, k) for k in _JOB_FIELDS}
    # its GPU totals (collector/state/cluster.py GpuUseTotals), so that a restart goes on counting: figures only
    info["gpu_totals"] = {u: [t.busy_seconds, t.covered_seconds, t.memory_peak, t.last_time]
                          for u, t in job.gpu_totals.items()}
    return JobRow(job.job_id, json.dumps(info), job.state, job.user, job.start_time, job.end_time)


_SAVE_JOB = ("INSERT INTO jobs VALUES (?,?,?,?,?,?,?) ON CONFLICT(job_id) DO UPDATE SET info=excluded.info,"
             " state=excluded.state, user=excluded.user, start_time=excluded.start_time,"
             " end_time=excluded.end_time, updated=excluded.updated")
_SAVE_NODE = ("INSERT INTO nodes VALUES (?,?,?,?,?,?) ON CONFLICT(node) DO UPDATE SET boot_id=excluded.boot_id,"
              " agent_version=excluded.agent_version, memory_total_bytes=excluded.memory_total_bytes,"
              " gpus=excluded.gpus, last_seen=excluded.last_seen")
_SAVE_SUMMARY = ("INSERT INTO job_summaries VALUES (?,?,?) ON CONFLICT(job_id) DO UPDATE SET view=excluded.view,"
                 " written=excluded.written")


WEB_SECRET_BYTES = 32


def web_token_secret(db_path: str) -> bytes:
    """The key of the web pages' form tokens (collector/web/actions.py), kept beside the store, in
    DB.web-secret, so that a confirmation page opened before a restart still works after it.

    Made once, mode 0600 and whole (written aside, then linked into place: a collector starting at the
    same moment reads all of it or makes its own). One readable by others, not ours, a link or of the
    wrong size may be known to someone else: it is replaced by a new one (open pages then ask again). A
    store in memory, or a folder that takes no file, gets a key of this run only, as before.
    """
    fresh = secrets.token_bytes(WEB_SECRET_BYTES)
    if db_path == ":memory:":
        return fresh
    path = os.path.abspath(db_path) + ".web-secret"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            st, key = os.fstat(fd), os.read(fd, WEB_SECRET_BYTES + 1)
        finally:
            os.close(fd)
        if st.st_uid == os.geteuid() and not st.st_mode & 0o077 and len(key) == WEB_SECRET_BYTES:
            return key
        replace = True
    except FileNotFoundError:
        replace = False
    except OSError:  # a link (ELOOP), or unreadable: a new one in its place
        replace = True
    aside = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, fresh)
            os.fsync(fd)
        finally:
            os.close(fd)
        if replace:
            os.replace(aside, path)
            logging.getLogger("clusterwatch.collector").warning(
                "%s was not this collector's alone (its mode, owner or size): replaced by a new key; open "
                "confirmation pages ask again", path)
            return fresh
        try:
            os.link(aside, path)
        except FileExistsError:  # another collector of this store made it first: its key
            os.unlink(aside)
            return web_token_secret(db_path)
        os.unlink(aside)
    except OSError as exc:
        try:
            os.unlink(aside)
        except OSError:
            pass
        logging.getLogger("clusterwatch.collector").warning(
            "cannot keep the web pages' key in %s (%s): confirmation pages opened before a restart will ask "
            "again", path, exc.strerror or exc)
    return fresh


#: The store and what SQLite makes beside it (-wal, -shm take the store's mode) are the collector's alone:
#: they hold every job's owner, command lines and provenance.
PRIVATE_FILE = 0o600
PRIVATE_FOLDER = 0o700


def _make_private(path: str) -> None:
    """Create the store file 0600 when missing (SQLite gives -wal and -shm its mode), and take group and other
    bits off it and its -wal/-shm where an older collector left them readable; files not ours are left."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE))
        return
    except FileExistsError:
        pass
    except OSError:
        return  # a folder that takes no file: connect() says what is wrong
    for name in (path, f"{path}-wal", f"{path}-shm"):
        try:
            # a plain file only: --db naming a folder (/tmp, say) must never have its mode changed
            st = os.lstat(name)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077:
                os.chmod(name, stat.S_IMODE(st.st_mode) & ~0o077)
        except OSError:
            pass


def _store_error(path: str, exc: sqlite3.Error) -> str:
    """One line for a store SQLite cannot use: what is wrong with it and what to do."""
    name = getattr(exc, "sqlite_errorname", "")
    if name.startswith("SQLITE_READONLY") or "readonly" in str(exc):
        return (f"the store {path} is read-only to this collector (uid {os.geteuid()}): give its user write "
                "access to the file and its folder, or pass --db with a writable path")
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in str(exc):
        return (f"the store {path} is locked by another process (another collector on the same --db?): stop "
                "it, or pass --db with another path")
    if name.startswith("SQLITE_CANTOPEN"):
        return (f"cannot open the store {path} ({exc}): check that this user may read and write the file and "
                "its folder, or pass --db with another path")
    return f"cannot use the store {path}: {exc}; pass --db with another path or move the broken file away"


def open_db(path: str) -> sqlite3.Connection:
    """Open (and create) the store; a path that cannot be used raises ConfigError with what to do.

    Made private (0600, in a 0700 folder when the folder is new) whatever the umask. A store that opens but
    cannot be written (read-only, or held by another process) is refused here, at start, in one line: SQLite
    opens a read-only file for reading without a word, and the first write would fail mid-start.
    """
    if path != ":memory:":
        folder = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(folder, mode=PRIVATE_FOLDER, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create the folder of the store {path}: {exc.strerror}; "
                              "pass --db with a writable path") from None
        _make_private(path)
    try:
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.executescript(SCHEMA)
        # A damaged page would otherwise surface as a traceback from the first read that meets it (the
        # restore, at start-up) or later, mid-ingest. quick_check reads every page once: milliseconds for
        # the few MB a store holds.
        problem = conn.execute("PRAGMA quick_check(1)").fetchone()[0]
        if problem == "ok":  # a write rolled back: a read-only store or one held elsewhere fails here
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute("CREATE TABLE write_probe (x)")
            finally:
                conn.execute("ROLLBACK")
    except sqlite3.DatabaseError as exc:
        raise ConfigError(_store_error(path, exc)) from None
    if problem != "ok":
        conn.close()
        problem = " ".join(problem.replace("*** in database main ***", "").split())  # one line
        raise ConfigError(f"the store {path} is damaged (SQLite: {problem}); move it away and start again "
                          "(a new store is created; the ended jobs' summaries it held can be salvaged with "
                          f"sqlite3 {path} .recover), or pass --db with another path")
    return conn


class Store:
    """Rows of nodes, jobs, summaries and provenance."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    @contextmanager
    def _transaction(self):
        """BEGIN … COMMIT; on any failure (a commit that fails on a full disk too) rolled back, so that the
        connection is left out of any transaction and the next one can begin."""
        self.conn.execute("BEGIN")
        try:
            yield
            self.conn.execute("COMMIT")
        except BaseException:
            if self.conn.in_transaction:
                self.conn.rollback()
            raise

    def save_node(self, node: str, boot_id: str, version: str, memory_total: int, gpus: list[str],
                  last_seen: float) -> None:
        self.conn.execute(_SAVE_NODE, (node, boot_id, version, memory_total, json.dumps(gpus), last_seen))

    def load_node_times(self) -> list[NodeSeen]:
        """Every node an agent ever reported from, and when it last did."""
        return list(map(NodeSeen._make, self.conn.execute("SELECT node, last_seen FROM nodes")))

    def save_job(self, job: JobState) -> None:
        self.conn.execute(_SAVE_JOB, (*job_row(job), time.time()))

    def save_closed_job(self, row: JobRow, job_id: str, view: bytes) -> None:
        """A closed job's final row (job_row) and its summary, in one transaction: both or neither."""
        now = time.time()
        with self._transaction():
            self.conn.execute(_SAVE_JOB, (*row, now))
            self.conn.execute(_SAVE_SUMMARY, (job_id, view, now))

    def amend_job_end(self, job_id: str, state: str, exit_code: int | None, end_time: float) -> None:
        """A stored job's final state, exit code and end time, as Slurm gave them after it was closed."""
        row = self.conn.execute("SELECT info FROM jobs WHERE job_id=?", (job_id,)).fetchone()
        if row is None:
            return
        info = json.loads(row[0])
        info["state"], info["end_time"] = state, end_time
        if exit_code is not None:
            info["exit_code"] = exit_code
        self.conn.execute("UPDATE jobs SET info=?, state=?, end_time=?, updated=? WHERE job_id=?",
                          (json.dumps(info), state, end_time, time.time(), job_id))

    def ended_since(self, since: float) -> list[JobEnd]:
        """The stored jobs that ended at or after `since`, oldest first."""
        return list(map(JobEnd._make, self.conn.execute(
            "SELECT job_id, end_time FROM jobs WHERE end_time >= ? AND end_time > 0 ORDER BY end_time", (since,))))

    def load_jobs(self, include_ended: bool = True) -> list[JobState]:
        rows = self.conn.execute("SELECT job_id, info FROM jobs ORDER BY start_time").fetchall()
        jobs = []
        for job_id, info in rows:
            loaded = json.loads(info)
            fields = {k: v for k, v in loaded.items() if k in _JOB_FIELDS}
            job = JobState(job_id, **fields)
            for uuid, (busy, covered, peak, last_time) in (loaded.get("gpu_totals") or {}).items():
                job.gpu_totals[uuid] = GpuUseTotals(busy, covered, peak, last_time)
            if include_ended or not job.ended:
                jobs.append(job)
        return jobs

    def save_summary(self, job_id: str, view: bytes) -> None:
        self.conn.execute(_SAVE_SUMMARY, (job_id, view, time.time()))

    def load_summary(self, job_id: str) -> bytes | None:
        row = self.conn.execute("SELECT view FROM job_summaries WHERE job_id=?", (job_id,)).fetchone()
        return row[0] if row else None

    def save_ingest(self, node_counts: list[tuple[str, list[tuple[int, float, int]]]],
                    seqs: list[tuple[str, int, list[int]]], nodes_seen: list[tuple[float, str]] = (), *,
                    nodes: list[NodeRow] = (), jobs: list[JobRow] = (),
                    provenance: list[ProvenanceRow] = ()) -> None:
        """Record, in one transaction, what batches changed: per-process sample counts, which batches are
        stored, node rows, job rows (job_row) and provenance records.

        The collector acknowledges a batch only after this commit, so after a crash a batch is
        either counted here and dropped as a duplicate when resent, or not counted and resent;
        and a batch is acknowledged only with everything it changed in the store.
        """
        now = time.time()
        with self._transaction():
            self.conn.executemany(_SAVE_NODE, [(n, b, v, m, json.dumps(g), seen) for n, b, v, m, g, seen in nodes])
            self.conn.executemany(_SAVE_JOB, [(*row, now) for row in jobs])
            self.conn.executemany("INSERT OR REPLACE INTO provenance VALUES (?,?,?,?,?)", provenance)
            self.conn.executemany(
                "INSERT INTO node_counts VALUES (?,?,?) ON CONFLICT(node) DO UPDATE SET counts=excluded.counts,"
                " updated=excluded.updated",
                [(node, json.dumps(counts, separators=(",", ":")), now) for node, counts in node_counts])
            self.conn.executemany(
                "INSERT INTO stream_seqs VALUES (?,?,?,?) ON CONFLICT(boot_id) DO UPDATE SET low=excluded.low,"
                " above=excluded.above, updated=excluded.updated",
                [(b, low, json.dumps(above), now) for b, low, above in seqs])
            self.conn.executemany("UPDATE nodes SET last_seen=? WHERE node=?", nodes_seen)

    def load_seqs(self) -> list[StreamSeqs]:
        return [StreamSeqs(b, low, json.loads(above)) for b, low, above in
                self.conn.execute("SELECT boot_id, low, above FROM stream_seqs")]

    def load_process_counts(self) -> dict[tuple[str, int, float], int]:
        out = {}
        for node, counts in self.conn.execute("SELECT node, counts FROM node_counts"):
            for pid, start_time, samples, *_ in json.loads(counts):
                out[(node, pid, start_time)] = samples
        return out

    def load_process_totals(self) -> dict[tuple[str, int, float], tuple[float, float]]:
        """(CPU seconds, first sample's time) of each process stored with them (entries of node_counts
        written since the totals were: [pid, start_time, samples, cpu_seconds, first_time])."""
        out = {}
        for node, counts in self.conn.execute("SELECT node, counts FROM node_counts"):
            for pid, start_time, _, *totals in json.loads(counts):
                if len(totals) >= 2:
                    out[(node, pid, start_time)] = (float(totals[0]), float(totals[1]))
        return out

    def forget_stale(self, older_than_s: float = STALE_AFTER_S) -> list[str]:
        """Forget the sample counts of nodes and the batch numbers of agent instances not written for
        `older_than_s` seconds (by this store's clock, the one that stamps the rows); returns the agent
        instances (boot ids) forgotten, for the caller to drop its trackers of them.

        Each agent start is a new instance with a row of its own, so without this the table (and the
        restore at start-up, which reads all of it) grows with every agent restart.
        """
        before = time.time() - older_than_s
        with self._transaction():
            gone = [b for (b,) in self.conn.execute("SELECT boot_id FROM stream_seqs WHERE updated < ?", (before,))]
            self.conn.execute("DELETE FROM stream_seqs WHERE updated < ?", (before,))
            self.conn.execute("DELETE FROM node_counts WHERE updated < ?", (before,))
        return gone

    def save_provenance(self, job_id: str, node: str, pid: int, start_time: float, record: str) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO provenance VALUES (?,?,?,?,?)", (job_id, node, pid, start_time, record)
        )

    def load_provenance(self, job_id: str) -> list[ProvenanceRow]:
        return list(map(ProvenanceRow._make, self.conn.execute(
            "SELECT job_id, node, pid, start_time, record FROM provenance WHERE job_id=? ORDER BY node, pid",
            (job_id,))))
