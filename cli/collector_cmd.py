"""`clusterwatch collector`: receive the agents' streams, keep state, serve /metrics and queries."""
from __future__ import annotations

import asyncio
import logging

import click

from .addresses import listen_option_callback, tcp_listen_option_callback
from .common import fail, resolve_token, setup_logging, token_file_option
from .help_text import examples

DEFAULT_WEB_LISTEN = "127.0.0.1:9752"


def _check_web_proxy(header: str | None, proxies, secret_file: str | None, web_listen: str | None) -> tuple[str, ...]:
    """--web-user-header needs a credential only the proxy has (a header anyone could write is worth nothing,
    and so is an address every user of the proxy's host sends from): its secret (--web-proxy-secret-file) or
    the pages on a Unix socket; --web-trusted-proxy only narrows where the secret is taken from. Each proxy an
    address or network."""
    import re

    from clusterwatch.collector.web.access import NO_CREDENTIAL, parse_proxies

    from clusterwatch.unix_address import unix_path

    on_socket = web_listen is not None and unix_path(web_listen) is not None
    if secret_file and not header:
        fail("--web-proxy-secret-file proves the proxy that names the user in --web-user-header: give both")
    if proxies and on_socket:
        fail("--web-trusted-proxy names TCP addresses; on a Unix socket (--web-listen unix:PATH) the socket's mode "
             "and --web-socket-group say who the proxy is: drop it")
    if proxies and not header:
        fail("--web-trusted-proxy says where the proxy's secret is taken from: give --web-user-header and "
             "--web-proxy-secret-file too")
    if header and not (secret_file or on_socket):
        fail(NO_CREDENTIAL)
    if header and not re.fullmatch(r"[A-Za-z0-9-]{1,64}", header):
        fail(f"--web-user-header {header!r}: give a header name (letters, digits and dashes), e.g. X-Remote-User")
    parse_proxies(proxies)  # a bad one is a ConfigError: one line and exit 2 (cli/main.py)
    return tuple(p.strip() for v in proxies for p in v.split(",") if p.strip())


def _web_socket_group(group: str | None, web_listen: str | None) -> int | None:
    """--web-socket-group (a name or gid) as a gid, for pages on a Unix socket whose folder only the collector's
    user may write; one line and exit 2 otherwise."""
    import grp

    from clusterwatch.collector.web.server import may_give_to_group, not_a_member, socket_folder_problem

    from clusterwatch.unix_address import unix_path

    path = unix_path(web_listen) if web_listen else None
    if group is not None and path is None:
        fail("--web-socket-group gives the pages' Unix socket to the proxy's group: give --web-listen unix:PATH too")
    problem = socket_folder_problem(path) if path is not None else None
    if problem:
        fail(problem)
    if group is None:
        return None
    try:
        gid = grp.getgrgid(int(group)).gr_gid if group.isdigit() else grp.getgrnam(group).gr_gid
    except KeyError:
        fail(f"--web-socket-group {group}: no such group on this host; give the proxy's group (e.g. apache)")
    if not may_give_to_group(gid):
        fail(not_a_member(gid))
    return gid


def _loopback_listen(listen: str) -> bool:
    """Whether a HOST:PORT (or 'none') serves on loopback only."""
    from clusterwatch.collector.web.app import is_loopback

    return listen == "none" or is_loopback(listen.rpartition(":")[0].strip("[]"))


def _web_listen_callback(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--web-listen: HOST:PORT, unix:PATH (for the site's proxy alone) or 'none'."""
    return listen_option_callback(ctx, param, value)


@click.command(epilog=examples(
    "clusterwatch collector --listen 0.0.0.0:50051 --metrics-listen 0.0.0.0:9400",
    "clusterwatch collector --slurm --db /var/lib/clusterwatch/clusterwatch.db",
    "clusterwatch collector --config /etc/clusterwatch/config.toml",
))
@click.option("--listen", default="127.0.0.1:50051", envvar="CLUSTERWATCH_LISTEN", show_default=True,
              callback=listen_option_callback,
              help="gRPC address for agents and queries (use 0.0.0.0:50051 to serve other hosts, or unix:PATH "
                   "for a Unix socket only those who may enter its folder can reach).")
@click.option("--query-listen", default=None, envvar="CLUSTERWATCH_QUERY_LISTEN", callback=listen_option_callback,
              help="Also serve the query service alone here, with TLS but no client certificate when --tls-cert "
                   "is set (for `status` on login nodes while agents use mutual TLS).")
@click.option("--metrics-listen", default="127.0.0.1:9750", envvar="CLUSTERWATCH_METRICS_LISTEN",
              callback=tcp_listen_option_callback,
              show_default=True, help="Prometheus endpoint address; 'none' to switch it off.")
@click.option("--web-listen", default=None, envvar="CLUSTERWATCH_WEB_LISTEN", callback=_web_listen_callback,
              help=f"Address of the jobs' web pages (HOST:PORT; default {DEFAULT_WEB_LISTEN}, where a port already "
                   "taken only warns; or unix:PATH, a socket for the site's proxy alone); 'none' to switch them "
                   "off. See docs/operators.md before leaving loopback.")
@click.option("--web-actions/--no-web-actions", default=False, envvar="CLUSTERWATCH_WEB_ACTIONS", show_default=True,
              help="Offer Diagnose, Request checkpoint and Stop on the job pages, to the job's owner and admins "
                   "as --web-user-header names them (without a proxy: only when queries are unauthenticated).")
@click.option("--web-user-header", default=None, envvar="CLUSTERWATCH_WEB_USER_HEADER", metavar="NAME",
              help="The authenticating reverse proxy's header naming the user (e.g. X-Remote-User); taken only "
                   "from the proxy, as its secret (--web-proxy-secret-file) or the Unix socket (--web-listen "
                   "unix:PATH) proves it.")
@click.option("--web-proxy-secret-file", default=None, envvar="CLUSTERWATCH_WEB_PROXY_SECRET_FILE", metavar="FILE",
              help="A file (mode 0600, the collector's user's or root's) holding the secret the proxy sends in "
                   "X-Clusterwatch-Proxy-Secret: without it, a request naming a user is refused.")
@click.option("--web-trusted-proxy", "web_trusted_proxies", multiple=True, envvar="CLUSTERWATCH_WEB_TRUSTED_PROXY",
              metavar="ADDR[/BITS]", help="Take the proxy's secret only from this address or network (repeatable, "
                                          "or comma separated); no proof alone.")
@click.option("--web-socket-group", default=None, envvar="CLUSTERWATCH_WEB_SOCKET_GROUP", metavar="GROUP",
              help="Give the pages' Unix socket (--web-listen unix:PATH) to the proxy's group, mode 0660 (without "
                   "it: 0600, the collector's user's alone); the collector's user must be a member.")
@click.option("--web-owner-uid", type=click.IntRange(min=0), default=None, metavar="UID",
              help="Answer only this local user's browsers (and root's), as the kernel names a loopback "
                   "connection's owner; --web-listen on loopback only (what `clusterwatch run` gives its own).")
@click.option("--allow-unauthenticated-actions", is_flag=True, envvar="CLUSTERWATCH_ALLOW_UNAUTHENTICATED_ACTIONS",
              help="Without query authentication (--query-auth none, or auto without munge), let everyone who "
                   "reaches the collector ask every job's processes for stacks, snapshots, a checkpoint or a "
                   "stop (diagnose, and the pages' actions with --web-actions); off: nobody may. Only for one "
                   "user's own collector (what `clusterwatch run` and `demo` give theirs).")
@click.option("--db", "db_path", default=None, envvar="CLUSTERWATCH_DB",
              help="SQLite store (default: /var/lib/clusterwatch/clusterwatch.db as root, "
                   "else ~/.local/state/clusterwatch/clusterwatch.db).")
@click.option("--history", "history_points", type=click.IntRange(min=10), default=720, show_default=True,
              help="Samples kept in memory per process and GPU.")
@click.option("--history-step", "history_step", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="Seconds between two history points of a process (trends and `record`; every sample still "
                   "updates the latest figures and peaks).")
@click.option("--per-process-metrics", is_flag=True, help="Also export per-process series (label pid).")
@click.option("--gpu-health-metrics", type=click.Choice(["basic", "full", "none"]), default="basic",
              show_default=True, envvar="CLUSTERWATCH_GPU_HEALTH_METRICS",
              help="GPU health series on /metrics: basic (loss, XIDs, uncorrected ECC, remaps, throttling, "
                   "temperature: about 10 a GPU), full (also corrected ECC, row counts, violation time, PCIe "
                   "and NVLink errors: about 24), or none.")
@click.option("--rules", "rules_path", type=click.Path(dir_okay=False), default=None,
              envvar="CLUSTERWATCH_RULES", help="Rules file (TOML); default: the shipped rules.")
@click.option("--token", envvar="CLUSTERWATCH_TOKEN", default=None, help="Shared secret agents must send.")
@token_file_option
@click.option("--agent-auth", type=click.Choice(["auto", "munge", "token", "tls", "none"]), default="auto",
              show_default=True, envvar="CLUSTERWATCH_AGENT_AUTH",
              help="What agents must prove: munge (root on their node, a munge credential; a node is bound to the "
                   "host that first spoke for it), token (--token), tls (--tls-client-ca), none (no action reaches "
                   "a process; one warning line), auto (tls or token when set, else munge where it is installed, "
                   "streams refused while munged does not answer; else none).")
@click.option("--ports-file", default=None, help="Write the bound ports here as JSON.")
@click.option("--slurm", is_flag=True, envvar="CLUSTERWATCH_SLURM",
              help="Ask Slurm (scontrol, SLURM_CONF from the environment) about jobs: names, users, states, "
                   "allocations; close jobs Slurm says ended.")
@click.option("--slurm-refresh", type=click.FloatRange(min=0.2), default=5.0, show_default=True,
              help="Seconds between the deployment's questions to Slurm (backs off while slurmctld does not "
                   "answer); a shard of N takes its turn, asking every N times this.")
@click.option("--ssh-known-hosts", type=click.Path(dir_okay=False), default=None,
              help="known_hosts for the nodes; with --ssh-key, nodes without an agent are asked for the "
                   "job's pids (scontrol listpids) over SSH.")
@click.option("--ssh-key", type=click.Path(dir_okay=False), default=None, help="Private key for SSH to the nodes.")
@click.option("--ssh-user", default="root", show_default=True, help="User for SSH to the nodes.")
@click.option("--ssh-port", type=click.IntRange(1, 65535), default=22, show_default=True,
              help="sshd port on the nodes.")
@click.option("--ssh-address", "ssh_address", multiple=True, metavar="NODE=HOST[:PORT]",
              help="Where to reach a node over SSH when not by its name (repeatable).")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), envvar="CLUSTERWATCH_TLS_CERT",
              help="Serve gRPC over TLS with this certificate (PEM); see docs/operators.md for making keys.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), envvar="CLUSTERWATCH_TLS_KEY",
              help="The certificate's private key (PEM).")
@click.option("--tls-client-ca", type=click.Path(exists=True, dir_okay=False), envvar="CLUSTERWATCH_TLS_CLIENT_CA",
              help="Require client certificates signed by this CA (mutual TLS).")
@click.option("--query-auth", type=click.Choice(["auto", "munge", "none"]), default="auto", show_default=True,
              envvar="CLUSTERWATCH_QUERY_AUTH",
              help="How `status` callers are identified: munge (users see their own jobs), none (everyone "
                   "sees everything), auto (munge where it is installed on this host; queries are refused "
                   "while munged does not answer; none where munge is not installed).")
@click.option("--munge-socket", default=None, envvar="CLUSTERWATCH_MUNGE_SOCKET",
              help="munged's socket, when not the default.")
@click.option("--query-admin", "query_admins", multiple=True, metavar="USER",
              help="A user (name or uid) who sees every job under munge (repeatable; root always does).")
@click.option("--show-all-jobs", is_flag=True, help="Under munge, every identified user sees every job.")
@click.option("--summary-dir", type=click.Path(file_okay=False), default=None, envvar="CLUSTERWATCH_SUMMARY_DIR",
              help="Write each ended job's JSON summary (provenance, hardware, command, peaks, alerts) here.")
@click.option("--agent-rate-limit", type=click.FloatRange(min=1), default=50_000.0, show_default=True,
              help="Process samples a second one agent may send (10 s bursts); a flood beyond it is slowed down.")
@click.option("--xid-catalog", "xid_catalog_path", type=click.Path(dir_okay=False), default=None,
              envvar="CLUSTERWATCH_XID_CATALOG",
              help="A site's XID catalog (TOML) over the shipped one: severity, action and advice per XID "
                   "(CLUSTERWATCH_XID_CATALOG).")
@click.option("--rules-interval", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="Seconds between two looks of the rules at one process (polls in between are stored, "
                   "not evaluated; the rules work in minutes). Capped at a third of the shortest leak bucket.")
@click.option("--collectors", default="", envvar="CLUSTERWATCH_COLLECTORS", metavar="HOST:PORT,...",
              help="The deployment's collectors list, when this is one shard of several (top-level "
                   "collectors = [...] in the config file); with --shard.")
@click.option("--collectors-before", default="", envvar="CLUSTERWATCH_COLLECTORS_BEFORE", metavar="JOB=HOST:PORT,...",
              help="The list the jobs numbered below JOB started on (docs/operators.md, Past one collector).")
@click.option("--shard", default=None, envvar="CLUSTERWATCH_SHARD", metavar="HOST:PORT",
              help="This collector's own entry in --collectors: its registry takes only the Slurm jobs that "
                   "are its own.")
@click.option("--alertmanager", multiple=True, envvar="CLUSTERWATCH_ALERTMANAGER", metavar="URL",
              help="Send every firing and resolved alert to this Alertmanager too (http://HOST:PORT; repeatable, "
                   "or comma separated: each of an HA cluster's).")
@click.option("--drain-max-nodes", type=click.IntRange(min=0), default=2, show_default=True,
              envvar="CLUSTERWATCH_DRAIN_MAX_NODES",
              help="Circuit breaker: drain steps take out at most this many nodes in --drain-window; past it "
                   "(or --drain-max-share) an alert notifies only (0: no drains).")
@click.option("--drain-max-share", type=click.FloatRange(0, 1), default=0.05, show_default=True,
              envvar="CLUSTERWATCH_DRAIN_MAX_SHARE",
              help="Circuit breaker: and at most this share of the nodes the collector knows (never under one "
                   "node), whichever is smaller.")
@click.option("--drain-window", type=click.FloatRange(min=1), default=3600.0, show_default=True,
              envvar="CLUSTERWATCH_DRAIN_WINDOW", help="Seconds the circuit breaker counts drains over.")
@click.option("--resume", is_flag=True, envvar="CLUSTERWATCH_RESUME",
              help="Resume a node clusterwatch drained (never one a person drained) once it is repaired and a "
                   "check passes; every step in the audit trail (with --slurm).")
@click.option("--resume-after", type=click.FloatRange(min=0), default=900.0, show_default=True,
              envvar="CLUSTERWATCH_RESUME_AFTER",
              help="Seconds without a health finding on a drained node's GPUs that count as a repair (a new "
                   "boot id from its agent counts at once).")
@click.option("--resume-window", type=click.FloatRange(min=0), default=86400.0, show_default=True,
              envvar="CLUSTERWATCH_RESUME_WINDOW",
              help="A node drained again this many seconds after clusterwatch resumed it is not resumed again "
                   "automatically.")
@click.option("-v", "--verbose", count=True,
              help="More log lines: -v adds the libraries' INFO lines (clusterwatch's own show always), -vv DEBUG.")
def collector(listen, query_listen, metrics_listen, web_listen, web_actions, web_user_header, web_proxy_secret_file,
              web_trusted_proxies, web_socket_group, web_owner_uid, allow_unauthenticated_actions, db_path,
              history_points, history_step,
              per_process_metrics, gpu_health_metrics, rules_path, token, token_file, agent_auth,
              ports_file, slurm, slurm_refresh, ssh_known_hosts, ssh_key, ssh_user, ssh_port, ssh_address,
              tls_cert, tls_key, tls_client_ca, query_auth, munge_socket, query_admins, show_all_jobs,
              summary_dir, agent_rate_limit, rules_interval, xid_catalog_path, collectors, collectors_before, shard,
              alertmanager, drain_max_nodes, drain_max_share, drain_window, resume, resume_after, resume_window,
              verbose) -> None:
    """Run the collector."""
    setup_logging(verbose)
    token = resolve_token(token, token_file)  # one line and exit 2 when unfit
    from clusterwatch.collector.config import CollectorConfig, default_db_path

    from clusterwatch.errors import ClusterwatchError

    _check_pairs(tls_cert, tls_key, tls_client_ca, ssh_known_hosts, ssh_key)
    pairs = _ssh_addresses(ssh_address)
    proxies = _check_web_proxy(web_user_header, web_trusted_proxies, web_proxy_secret_file, web_listen)
    socket_group = _web_socket_group(web_socket_group, web_listen)
    _check_shard(collectors, collectors_before, shard)
    if resume and not slurm:
        fail("--resume resumes nodes through Slurm: give --slurm too")
    if db_path:
        _check_db_path(db_path)
    if web_owner_uid is not None and not _loopback_listen(web_listen or DEFAULT_WEB_LISTEN):
        fail("--web-owner-uid knows a browser's user only on loopback: give --web-listen 127.0.0.1:PORT")
    config = CollectorConfig(
        listen=listen, query_listen=query_listen, metrics_listen=None if metrics_listen == "none" else metrics_listen,
        db_path=db_path or default_db_path(), history_points=history_points, history_step_s=history_step,
        per_process_metrics=per_process_metrics, gpu_health_metrics=gpu_health_metrics, rules_path=rules_path,
        token=token, agent_auth=agent_auth, ports_file=ports_file,
        slurm=slurm, slurm_refresh_s=slurm_refresh, ssh_known_hosts=ssh_known_hosts, ssh_key=ssh_key,
        ssh_user=ssh_user, ssh_port=ssh_port, ssh_address=tuple(pairs),
        tls_cert=tls_cert, tls_key=tls_key, tls_client_ca=tls_client_ca,
        query_auth=query_auth, munge_socket=munge_socket, query_admins=tuple(query_admins),
        show_all_jobs=show_all_jobs, summary_dir=summary_dir, agent_rate_limit=agent_rate_limit,
        rules_interval_s=rules_interval, web_listen=None if web_listen == "none" else web_listen or DEFAULT_WEB_LISTEN,
        web_listen_required=web_listen is not None, web_actions=web_actions,
        web_user_header=web_user_header or None, web_trusted_proxies=proxies, web_owner_uid=web_owner_uid,
        web_proxy_secret_file=web_proxy_secret_file, web_socket_group=socket_group,
        allow_unauthenticated_actions=allow_unauthenticated_actions,
        collectors=collectors, collectors_before=collectors_before, shard=shard, xid_catalog_path=xid_catalog_path,
        alertmanagers=tuple(alertmanager), drain_max_nodes=drain_max_nodes, drain_max_share=drain_max_share,
        drain_window_s=drain_window, resume=resume, resume_after_s=resume_after, resume_window_s=resume_window,
    )

    try:
        asyncio.run(_serve(config))
    except ClusterwatchError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot start the collector: {exc}; is another collector using the port?")


def _check_db_path(path: str) -> None:
    """A --db the user gave names a file in a folder that exists: one line and exit 2 otherwise. Its folder is
    never created (the default path's is): a typo run as root would leave folders wherever it pointed."""
    import os

    from .option_source import given_as

    said = given_as(click.get_current_context(silent=True), "db_path", "--db")
    if os.path.isdir(path):
        fail(f"{said} {path} is a folder; it names the store's file: give {os.path.join(path, 'clusterwatch.db')}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        fail(f"{said} {path}: the folder {folder} does not exist; create it (mkdir -p {folder}) or fix the path")


async def _serve(config) -> None:
    from clusterwatch.collector.service import CollectorServer

    server = CollectorServer(config)
    await server.start()
    grpc_at = config.listen if config.listen.startswith("unix:") else f"port {server.grpc_port}"
    logging.getLogger("clusterwatch.collector").info(
        "collector: gRPC on %s, /metrics on port %s, web pages on port %s, store %s", grpc_at,
        server.metrics_port or "-", server.web_port or "-", config.db_path)
    await server.run_until_stopped()


def _check_shard(collectors: str, collectors_before: str, shard: str | None) -> None:
    """--shard names this collector's entry of --collectors: one line and exit 2 when it does not."""
    from clusterwatch.shards import Collectors, ShardError

    if not shard:
        return
    if not collectors:
        fail("--shard needs --collectors (the deployment's list, or collectors = [...] in the config file)")
    try:
        found = Collectors.parse(collectors, collectors_before or None)
    except ShardError as exc:
        fail(str(exc))
    if shard not in found.all:
        fail(f"--shard {shard} is not in --collectors {collectors}; give this collector's entry as the list spells it")


def _check_pairs(tls_cert, tls_key, tls_client_ca, ssh_known_hosts, ssh_key) -> None:
    """Options that go together: one line and exit 2 when one comes without the other."""
    if bool(tls_cert) != bool(tls_key):
        fail("--tls-cert and --tls-key go together")
    if tls_client_ca and not tls_cert:
        fail("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS runs over TLS)")
    if bool(ssh_known_hosts) != bool(ssh_key):
        fail("--ssh-known-hosts and --ssh-key go together (host keys are always checked)")


def _ssh_addresses(items) -> list[tuple[str, str]]:
    """--ssh-address NODE=HOST[:PORT] values as (node, target) pairs; one line and exit 2 for a bad one."""
    pairs = []
    for item in items:
        node, sep, target = item.partition("=")
        if not sep or not node or not target:
            fail(f"--ssh-address {item!r}: expected NODE=HOST[:PORT]")
        pairs.append((node, target))
    return pairs
