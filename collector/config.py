"""The collector's configuration: one frozen object, built in clusterwatch.cli and passed in."""
from __future__ import annotations

import os
from dataclasses import dataclass


def default_db_path() -> str:
    """Where the store lives unless --db says otherwise.

    `$CLUSTERWATCH_DB`, else /var/lib/clusterwatch/clusterwatch.db when running as root
    (a service), else ~/.local/state/clusterwatch/clusterwatch.db.
    """
    env = os.environ.get("CLUSTERWATCH_DB")
    if env:
        return env
    if os.geteuid() == 0:
        return "/var/lib/clusterwatch/clusterwatch.db"
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(state, "clusterwatch", "clusterwatch.db")


@dataclass(frozen=True, slots=True)
class CollectorConfig:
    """Everything the collector needs to run.

    Attributes:
        listen: gRPC address for agents and the query service, HOST:PORT (port 0: any free port).
        metrics_listen: HTTP address of the Prometheus endpoint, HOST:PORT; None: no endpoint.
        db_path: SQLite file for nodes, jobs, summaries and alerts (":memory:" for none).
        history_points: samples kept in memory per process and GPU series.
        per_process_metrics: also export per-process series (label pid) on /metrics.
        agent_down_after_intervals: a node is down after this many poll intervals without a batch.
        rules_path: rules file (TOML); None: the shipped defaults.
        token: shared secret agents must send; None: no token check.
        tls_cert / tls_key / tls_client_ca: server TLS, and client certificates checked against the CA.
        slurm: ask Slurm (scontrol) about jobs.
        ports_file: write the bound ports here as JSON (for tests and `run`, which use port 0).
    """

    listen: str = "127.0.0.1:50051"
    metrics_listen: str | None = "127.0.0.1:9750"
    db_path: str = ":memory:"
    history_points: int = 720
    per_process_metrics: bool = False
    agent_down_after_intervals: float = 3.0
    rules_path: str | None = None
    token: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    slurm: bool = False
    ports_file: str | None = None
