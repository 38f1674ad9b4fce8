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
        listen: gRPC address for agents and the query service, HOST:PORT (port 0: any free port) or
            unix:PATH (a Unix socket: only those who may enter its folder reach it).
        query_listen: a second address serving only the query service, with TLS but no client
            certificate when TLS is on (login nodes have no agent certificates); None: none.
        metrics_listen: HTTP address of the Prometheus endpoint, HOST:PORT; None: no endpoint.
        web_listen: HTTP address of the jobs' web pages (collector/web/), HOST:PORT, or unix:PATH (a socket for
            the site's proxy alone, mode 0660 with web_socket_group, else 0600); None: no pages.
        web_listen_required: a taken web_listen stops the start; False (the CLI's default address): a
            warning, and no pages (a second collector on a workstation, or tests, must still start).
        web_actions: the job pages offer Diagnose, Request checkpoint and Stop to the job's owner and admins
            (collector/web/access.py says who a browser is); False: the pages are read-only.
        web_user_header: the authenticating reverse proxy's header naming the user (e.g. X-Remote-User);
            taken only from a request that proves it is the proxy's (web_proxy_secret_file, or the Unix
            socket); None: no proxy.
        web_trusted_proxies: addresses or networks (text, e.g. "10.1.2.3", "10.1.0.0/16") the proxy's secret
            is taken from (no proof alone: every user of the proxy's host sends from it).
        web_proxy_secret_file: a file (mode 0600) holding the secret the proxy sends in
            X-Clusterwatch-Proxy-Secret (collector/web/access.py); None: none.
        web_socket_group: the gid the pages' Unix socket is given to (mode 0660): the proxy's group.
        web_owner_uid: the pages answer only this local user's loopback connections (and root's), as the
            kernel's socket table names them (collector/web/peer.py; `clusterwatch run`); None: anyone's.
        allow_unauthenticated_actions: without query authentication, every caller (the query service's, and
            a browser without a proxy with web_actions) may ask every job's processes for stacks, snapshots, a
            checkpoint or a stop (collector/queries/action_rights.py); False: nobody may ask them.
        db_path: SQLite file for nodes, jobs, summaries and alerts (":memory:" for none).
        history_points: samples kept in memory per process and GPU series.
        history_step_s: at most one history point per process this often (trends, `record`).
        per_process_metrics: also export per-process series (label pid) on /metrics.
        gpu_health_metrics: GPU health series on /metrics: "basic", "full" or "none"
            (collector/health/metrics.py).
        agent_down_after_intervals: a node is down after this many poll intervals without a batch.
        rules_path: rules file (TOML); None: the shipped defaults.
        xid_catalog_path: a site's XID catalog (TOML, the form of collector/health/xid_catalog.toml) laid
            over the shipped one, entry by entry and field by field; None: the shipped catalog alone.
        token: shared secret agents must send; None: no token check.
        agent_auth: what agents' streams must prove (collector/ingest/agent_auth.py): "token", "tls", "munge" (a
            credential of root on the agent's host, the node bound to that host), "none" (no action reaches a
            process, and samples own no job), or "auto" (tls or token when configured, else munge where it is
            installed: while munged does not answer streams are refused and munge tried again; else none).
        tls_cert / tls_key / tls_client_ca: server TLS, and client certificates checked against the CA.
        slurm: ask Slurm (scontrol) about jobs (collector/jobmap/registry.py).
        slurm_refresh_s: seconds between the registry's passes while Slurm answers (it backs off when not).
        slurm_timeout_s: seconds before one scontrol call counts as Slurm not answering.
        ssh_known_hosts: known_hosts file the nodes' host keys are checked against; with ssh_key, the
            registry runs `scontrol listpids` over SSH on nodes without a reporting agent.
        ssh_key: private key file to log in to the nodes with.
        ssh_user: user to log in as (root sees every job's processes).
        ssh_port: sshd port on the nodes.
        ssh_address: (node, "host[:port]") pairs for nodes not reachable by their own name.
        ports_file: write the bound ports here as JSON (for tests and `run`, which use port 0).
        query_auth: "munge" (callers prove their uid; users see their own jobs), "none", or "auto"
            (munge where it is installed on this host: while munged does not answer, queries are
            refused and munge tried again; none, with a warning, where munge is not installed).
        munge_socket: munged's socket when not the default.
        query_admins: users (names or uids) who see every job under munge; root always does.
        show_all_jobs: under munge, every identified user sees every job (like PrivateData off).
        summary_dir: write each ended job's JSON summary here (None: off).
        agent_rate_limit: process samples a second one agent may send on average (bursts of 10 s
            allowed); beyond it its batches are slowed down and counted.
        rules_interval_s: each process is shown to the rules at most this often (they work in minutes).
        alertmanagers: Alertmanager URLs (http://HOST:PORT) every firing and resolved alert is sent to, each
            of them (an HA cluster's, as Prometheus lists them; collector/alerting/alertmanager.py); (): none.
        drain_max_nodes: the drain action's circuit breaker (collector/alerting/breaker.py): at most this many
            nodes drained in drain_window_s...
        drain_max_share: ...and at most this share of the nodes known (never under one node); past either,
            drains are held and the alerts notify only.
        drain_window_s: the breaker's window, in seconds.
        resume: resume a node clusterwatch drained once it is repaired and a check passes
            (collector/alerting/resume.py); needs slurm.
        resume_after_s: the node's GPUs without a health finding this long is a repair (a new agent boot id is
            one at once).
        resume_window_s: a node drained again this soon after clusterwatch resumed it is not resumed again.
    """

    listen: str = "127.0.0.1:50051"
    query_listen: str | None = None
    metrics_listen: str | None = "127.0.0.1:9750"
    web_listen: str | None = None
    web_listen_required: bool = True
    web_actions: bool = False
    web_user_header: str | None = None
    web_trusted_proxies: tuple[str, ...] = ()
    web_proxy_secret_file: str | None = None
    web_socket_group: int | None = None
    web_owner_uid: int | None = None
    allow_unauthenticated_actions: bool = False
    db_path: str = ":memory:"
    history_points: int = 720
    history_step_s: float = 5.0
    per_process_metrics: bool = False
    gpu_health_metrics: str = "basic"
    agent_down_after_intervals: float = 3.0
    rules_path: str | None = None
    xid_catalog_path: str | None = None
    token: str | None = None
    agent_auth: str = "auto"
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    slurm: bool = False
    slurm_refresh_s: float = 5.0
    slurm_timeout_s: float = 5.0
    ssh_known_hosts: str | None = None
    ssh_key: str | None = None
    ssh_user: str = "root"
    ssh_port: int = 22
    ssh_address: tuple[tuple[str, str], ...] = ()
    ports_file: str | None = None
    query_auth: str = "auto"
    munge_socket: str | None = None
    query_admins: tuple[str, ...] = ()
    show_all_jobs: bool = False
    summary_dir: str | None = None
    agent_rate_limit: float = 50_000.0
    rules_interval_s: float = 5.0
    # One shard of several (clusterwatch/shards.py): the deployment's collectors list, the list older jobs
    # keep (JOB=HOST:PORT,...), and this collector's own entry. No shard: it holds every job Slurm lists.
    collectors: str = ""
    collectors_before: str = ""
    shard: str | None = None
    alertmanagers: tuple[str, ...] = ()
    drain_max_nodes: int = 2
    drain_max_share: float = 0.05
    drain_window_s: float = 3600.0
    resume: bool = False
    resume_after_s: float = 900.0
    resume_window_s: float = 86400.0
