"""The collector application: builds the core, alerting, the job registry and the exporter, and owns
start, stop, the tick and the flush loop. The servicers it serves are collector/ingest/service.py
(agents) and collector/queries/service.py (users).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from pathlib import Path

import grpc
from clusterwatch.v1 import agent_pb2_grpc, query_pb2_grpc

from clusterwatch.errors import ConfigError
from clusterwatch.tls import server_credentials

from .alerting.actions import Dispatcher
from .alerting.alertmanager import AlertmanagerNotifier, alertmanager_urls, page_base_url
from .alerting.alerts import AlertStore
from .alerting.audit import ActionAudit
from .alerting.breaker import BreakerLimits, DrainBreaker
from .alerting.live import Alerting
from .alerting.resume import Resumer, ResumeSettings
from .alerting.train_asks import TrainAsks
from .config import CollectorConfig
from .export import ClusterCollector, Exposition, serve_metrics
from .export.counter_metrics import counter_families
from .health.engine import HealthEngine
from .health.gpu_jobs import GpuJobRecorder
from .health.kmsg_marks import KmsgMarks
from .health.live import HealthListener
from .health.mig import gpu_serial
from .health.offenders import FindingHistory
from .ingest.agent_auth import TokenInterceptor, agent_auth_from_config
from .ingest.service import FLUSH_S, AgentOutboxes, IngestServicer
from .queries.auth import auth_from_config
from .queries.service import QueryServicer
from .rules import load_rules
from .serving.gc_tuning import tune_gc
from .serving.grpc_guard import MalformedMessageInterceptor
from .serving.grpc_limits import connection_caps, raise_open_file_limit, server_options
from .serving.listen_check import NO_REUSEPORT, bind, taken_error
from .state.core import CollectorCore, new_cluster_state
from .state.store import Store, open_db

log = logging.getLogger("clusterwatch.collector")

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
TICK_S = 1.0


def _owns_node(config: CollectorConfig):
    """Whether a node's own series are this shard's (clusterwatch/shards.py for_node); None when not a shard."""
    if not config.shard:
        return None
    from clusterwatch.shards import Collectors

    deployment = Collectors.parse(config.collectors, config.collectors_before or None)
    return lambda node: deployment.for_node(node) == config.shard


def slurm_drain(timeout_s: float):
    """drain_node(node, reason) for the alert actions: scontrol through the bounded runner, from an action lane's
    thread (which has no event loop of its own)."""
    from .jobmap.scontrol import ScontrolMapper

    mapper = ScontrolMapper(timeout_s=timeout_s, retries=1)

    def drain_node(node: str, reason: str) -> None:
        asyncio.run(mapper.drain_node(node, reason))

    return drain_node


class SlurmResume:
    """What a resume asks of Slurm (collector/alerting/resume.py): scontrol through the bounded runner, from the
    resumer's own thread."""

    def __init__(self, timeout_s: float) -> None:
        from .jobmap.scontrol import ScontrolMapper

        self.mapper = ScontrolMapper(timeout_s=timeout_s, retries=1)

    def node_drain(self, node: str):
        return asyncio.run(self.mapper.node_drain(node))

    def resume_node(self, node: str) -> None:
        asyncio.run(self.mapper.resume_node(node))


class CollectorServer:
    """The running collector: gRPC server, Prometheus endpoint, periodic tick."""

    def __init__(self, config: CollectorConfig) -> None:
        self.config = config
        rules = load_rules(config.rules_path)  # a bad rules file stops the start with one line
        from .health.xid_catalog import CatalogError, load_catalog

        try:  # so does a bad XID catalog
            catalog = load_catalog(Path(config.xid_catalog_path) if config.xid_catalog_path else None)
        except CatalogError as exc:
            raise ConfigError(str(exc)) from None
        conn = open_db(config.db_path)
        store = Store(conn)
        alert_store = AlertStore(conn)
        # a leak bucket must see a sample: look at least three times a bucket (short demo buckets too)
        buckets = (rules.gpu_memory_leak.bucket_s, rules.host_memory_leak.bucket_s, rules.handle_leak.bucket_s,
                   rules.gpu_memory_fragmentation.bucket_s)
        look_s = min(config.rules_interval_s, min(buckets) / 3)
        # `record` writes the history as the trace `replay` runs the rules over: a point less often than the
        # rules look leaves buckets without a sample there, and the replay misses leaks raised here
        state = new_cluster_state(config, max_history_step_s=look_s)
        # Built in the order they need one another; the core comes last, as it tells the alerting of ingest.
        outboxes = AgentOutboxes()
        # requests back to training processes (diagnose, checkpoint/stop steps); an alert of a whole job asks
        # its processes as the core's live view names them (self.core, built below, by the time one is asked)
        self.train_asks = TrainAsks(conn, outboxes.send_train_request,
                                    lambda job_id: self.core.live_job_view(job_id, 2), why_unreachable=outboxes.why_not)
        dispatcher = Dispatcher(
            alert_store, rules.actions, send_signal=outboxes.send_signal,
            # the drain action (off unless a rules file has a drain step)
            drain_node=slurm_drain(config.slurm_timeout_s) if config.slurm else None,
            ask_train=self.train_asks.ask_for_alert,
            # an alert drains a node only on what its authenticated agent said (a forged sample drains nothing)
            node_trusted=lambda node: bool((ns := state.nodes.get(node)) is not None and ns.authenticated),
            # every alert to the site's Alertmanagers too, its user read from the job as it fires
            alertmanager=AlertmanagerNotifier(alertmanager_urls(config.alertmanagers),
                                              job_user=lambda job_id: getattr(state.jobs.get(job_id), "user", ""))
            if config.alertmanagers else None,
            # never more than a few nodes drained an hour, whatever fires (counted in the store: restarts too)
            breaker=DrainBreaker(conn, BreakerLimits(config.drain_max_nodes, config.drain_max_share,
                                                     config.drain_window_s), lambda: len(state.nodes)),
            # every automatic action, why and what came of it (health --history, /metrics)
            audit=ActionAudit(conn))
        health = HealthEngine(catalog)
        # every finding kept 90 days, and the rules file's escalations over them and over the drains
        self.offenders = FindingHistory(conn, rules.escalations,
                                        serial_of=lambda node, uuid: gpu_serial(state, node, uuid))
        # the health rules' alerts go to the same table and actions as the others (self.alerting, built next)
        health_listener = HealthListener(health, state, self._handle_health, marks=KmsgMarks(conn))
        self.alerting = Alerting(rules, state, alert_store, min_interval_s=look_s, dispatcher=dispatcher,
                                 health=health_listener)
        # --resume: a node clusterwatch drained comes back once repaired and checked (every step audited)
        self.resumer = Resumer(conn, dispatcher.audit, state, health, SlurmResume(config.slurm_timeout_s),
                               ResumeSettings(config.resume_after_s, config.resume_window_s, config.drain_window_s,
                                              config.agent_down_after_intervals),
                               node_trusted=dispatcher.node_trusted) \
            if config.resume and config.slurm and dispatcher.audit is not None else None
        self.core = CollectorCore(config, store, state=state, alerts=self.alerting, health=health,
                                  listeners=[self.alerting, *([self.resumer] if self.resumer is not None else []),
                                             # every job's GPUs kept, for in_every_job escalations
                                             GpuJobRecorder(state, self.offenders, self.alerting.handle)])
        self.outboxes = outboxes
        # the agents' stream: built by start(), which finds out what agents must prove (munge is asked)
        self.ingest: IngestServicer | None = None
        running = self.core.running_nodes()
        self.alerting.restore_nodes([(n, seen, n in running) for n, seen in store.load_node_times()])
        self.grpc_port = 0
        self.metrics_port = 0
        self._server: grpc.aio.Server | None = None
        self._httpd = None
        self._flusher: asyncio.Future | None = None
        self._query_server: grpc.aio.Server | None = None
        self.query_port = 0
        self.web_port = 0
        self._web = None
        self._web_access = None  # who the pages took requests from (its refusals are counted on /metrics)
        self._query_cap = 0
        self._registry = None

    def _handle_health(self, events: list, now: float) -> None:
        """The health rules' alerts, and the escalations they raise: a finding's at once, a drain's once the
        alert's drain step has been decided (its audit row is written by then)."""
        self.alerting.handle([*events, *self.offenders.record(events, now)], now)
        drained = [a for node in sorted({e.node for e in events}) for a in self.offenders.check_drains(node, now)]
        if drained:
            self.alerting.handle(drained, now)

    async def start(self) -> None:
        cfg = self.config
        # a taken port stops the start before anything else is said or opened
        required_web = cfg.web_listen if cfg.web_listen_required else None
        for listen, flag in ((cfg.listen, "--listen"), (cfg.query_listen, "--query-listen"),
                             (cfg.metrics_listen, "--metrics-listen"), (required_web, "--web-listen")):
            problem = taken_error(listen, flag) if listen else None
            if problem is not None:
                raise ConfigError(problem)
        self._proxy_secret = None
        if cfg.web_listen and cfg.web_proxy_secret_file:
            from .web.access import read_proxy_secret

            self._proxy_secret = read_proxy_secret(cfg.web_proxy_secret_file)  # ConfigError: one line
        tune_gc()
        # what agents must prove: one warning line where nothing is asked (then no action reaches a process)
        auth = await agent_auth_from_config(cfg.agent_auth, cfg.token, cfg.tls_client_ca, cfg.munge_socket, cfg.listen)
        self.ingest = IngestServicer(self.core, self.outboxes, cfg.agent_rate_limit, auth=auth,
                                     on_train_answer=self.train_asks.on_answer)
        main_cap, self._query_cap = connection_caps(raise_open_file_limit(), bool(cfg.query_listen))
        server = self._main_server(main_cap)
        query = QueryServicer(self.core, await auth_from_config(
            cfg.query_auth, frozenset(cfg.query_admins), cfg.show_all_jobs, cfg.munge_socket, cfg.listen),
            alerts=self.alerting, asks=self.train_asks, unauthenticated_actions=cfg.allow_unauthenticated_actions)
        from .queries.action_rights import start_warning

        # a page whose connections are one user's (--web-owner-uid) is that user's alone
        pages = cfg.web_listen if cfg.web_actions and cfg.web_owner_uid is None else None
        warning = start_warning(cfg.allow_unauthenticated_actions, query.auth, [cfg.listen, cfg.query_listen, pages])
        if warning:
            log.warning("%s", warning)
        self._add_query_services(query, server)
        creds = server_credentials(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca)
        self.grpc_port = bind(server, cfg.listen, "--listen", creds)
        await server.start()
        self._server = server
        if cfg.query_listen:
            await self._start_query_server(query)
        if cfg.slurm:
            from .jobmap.registry import build_registry

            self._registry = build_registry(self.core, cfg)
            self._registry.start()
        self._flusher = asyncio.ensure_future(self._flush_loop())
        if cfg.metrics_listen:
            self._start_metrics()
        if cfg.web_listen:
            self._start_web(query.auth)
        if cfg.ports_file:
            self._write_ports(cfg.ports_file)

    def _main_server(self, max_connections: int) -> grpc.aio.Server:
        """The server of --listen, with the ingest service on it (the query service is added by start)."""
        interceptors = []
        if self.config.token:
            interceptors.append(TokenInterceptor(self.config.token, self._count_unauthenticated))
        interceptors.append(MalformedMessageInterceptor(self._count_rejected))
        server = grpc.aio.server(interceptors=interceptors, options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
            # a dead agent's stream is closed within 40 s: until then a reconnecting agent is refused its node
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            NO_REUSEPORT,
            *server_options(max_connections),
        ])
        agent_pb2_grpc.add_IngestServicer_to_server(self.ingest, server)
        return server

    def _write_ports(self, path: str) -> None:
        """The ports bound, as JSON, written whole (a reader never sees half a file)."""
        with open(path + ".tmp", "w") as f:
            json.dump({"grpc": self.grpc_port, "metrics": self.metrics_port, "query": self.query_port,
                       "web": self.web_port}, f)
        os.replace(path + ".tmp", path)

    def _count_unauthenticated(self) -> None:
        self.core.count("unauthenticated")

    def _count_rejected(self) -> None:
        self.core.count("rejected")

    def counter_values(self) -> dict[str, tuple[float, str]]:
        """The core's ingest counters, the servicer's own and the job registry's, as /metrics names them."""
        # before start() (a scrape in a bench, say) the stream has refused nobody yet: its counts read 0
        ingest = self.ingest.counts() if self.ingest is not None else dict.fromkeys(IngestServicer.COUNTS, 0)
        counts = {**self.core.counts(), **ingest,
                  "health_repeated": self.alerting.health.engine.duplicates,
                  "drains_refused": self.alerting.dispatcher.drains_refused}
        if (breaker := self.alerting.dispatcher.breaker) is not None:
            counts["drains_held"] = breaker.held
        if (alertmanager := self.alerting.dispatcher.alertmanager) is not None:
            counts["alertmanager_errors"] = alertmanager.errors
            counts["alertmanager_dropped"] = alertmanager.dropped
        if self._web_access is not None:
            counts["web_forged"] = self._web_access.forged
            counts["web_other_users"] = self._web_access.other_users
        if self._registry is not None:
            counts["slurm_records_skipped"] = self._registry.records_skipped
        return counter_families(counts)

    def _add_query_services(self, query: QueryServicer, server: grpc.aio.Server) -> None:
        """The users' query service, and beside it the operators' audit trail (same auth, same ports)."""
        from clusterwatch.v1 import actions_pb2_grpc

        from .queries.actions_service import ActionsServicer

        query_pb2_grpc.add_QueryServicer_to_server(query, server)
        actions_pb2_grpc.add_ActionsServicer_to_server(ActionsServicer(query, self.alerting.dispatcher.audit), server)

    async def _start_query_server(self, query: QueryServicer) -> None:
        """The query service alone on --query-listen: TLS without client certificates when TLS is on."""
        server = grpc.aio.server(interceptors=[MalformedMessageInterceptor(self._count_rejected)],
                                 options=[NO_REUSEPORT, *server_options(self._query_cap)])
        self._add_query_services(query, server)
        cfg = self.config
        creds = server_credentials(cfg.tls_cert, cfg.tls_key)  # no client certificates: login nodes have none
        self.query_port = bind(server, cfg.query_listen, "--query-listen", creds)
        await server.start()
        self._query_server = server

    def _start_metrics(self) -> None:
        # A scrape copies what it exports under the core's lock (ingest writes the state under it)
        # and writes the text outside it (collector/export/).
        exposition = Exposition(ClusterCollector(
            self.core.state, self.core.clock, self.config.per_process_metrics,
            counters=self.counter_values, alerts=self.active_alerts,
            after_intervals=self.config.agent_down_after_intervals, extra=self.extra_families(),
            owns_node=_owns_node(self.config),
        ), self.core.lock)
        host, _, port = self.config.metrics_listen.rpartition(":")
        self._httpd = serve_metrics(exposition, host.strip("[]") or "127.0.0.1", int(port))
        self.metrics_port = self._httpd.server_port

    def extra_families(self):
        """The families after the state's: the GPU health ones, the automatic actions' counts, the repeat
        offenders'."""
        from .export.action_families import ActionFamilies, Chained
        from .export.offender_families import OffenderFamilies

        audit = self.alerting.dispatcher.audit
        return Chained(self.health_families(), ActionFamilies(audit.count_rows) if audit is not None else None,
                       OffenderFamilies(self.offenders.figures))

    def health_families(self):
        """The GPU health families of /metrics (collector/health/metrics.py), as the exporter takes them."""
        from .health.metrics import HealthFamilies, health_snapshot

        if self.config.gpu_health_metrics == "none":
            return None
        return HealthFamilies(lambda: health_snapshot(self.alerting.health.engine, self.core.state),
                              full=self.config.gpu_health_metrics == "full")

    def _start_web(self, auth) -> None:
        """The jobs' pages (collector/web/), seen as the query service's rules let a browser see them."""
        from clusterwatch.unix_address import unix_path

        from .web.access import BrowserAccess, parse_proxies
        from .web.app import WebApp, is_loopback
        from .web.server import serve_web, serve_web_unix

        cfg = self.config
        problem = taken_error(cfg.web_listen, "--web-listen")  # a required one was checked first thing
        if problem is not None:
            log.warning("%s: serving no web pages (pass --web-listen HOST:PORT or none)", problem)
            return
        socket_path = unix_path(cfg.web_listen)
        host, _, port = cfg.web_listen.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        access = BrowserAccess(auth, cfg.web_user_header, parse_proxies(cfg.web_trusted_proxies),
                               frozenset(cfg.query_admins), cfg.show_all_jobs, owner_uid=cfg.web_owner_uid,
                               unauthenticated_actions=cfg.allow_unauthenticated_actions,
                               proxy_secret=self._proxy_secret)
        self._web_access = access
        # actions (--web-actions) ask through TrainAsks on this loop, where its store connection lives;
        # a Unix socket needs no Host check (no browser reaches it to be rebound)
        app = WebApp(self.core, self.alerting, access, loopback=socket_path is None and is_loopback(host),
                     asks=self.train_asks if cfg.web_actions else None, loop=asyncio.get_running_loop())
        if socket_path is not None:
            self._web = serve_web_unix(app, socket_path, cfg.web_socket_group)
            return
        self._web = serve_web(app, host, int(port))
        self.web_port = self._web.server_port
        if self.alerting.dispatcher.alertmanager is not None:  # its alerts link their job's page
            self.alerting.dispatcher.alertmanager.page_base = page_base_url(host, self.web_port)

    def active_alerts(self):
        return self.alerting.exported()

    async def run_until_stopped(self) -> None:
        """Serve until SIGTERM/SIGINT, ticking every second; then stop gracefully."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), TICK_S)
            except asyncio.TimeoutError:
                pass
            try:
                self.core.tick()
            except Exception:
                log.exception("collector tick failed; it runs again in a second")
        await self.stop()

    async def _flush_loop(self) -> None:
        """Every FLUSH_S: one transaction for all batches since the last, then their acks."""
        failing = False  # said once a streak: a full disk fails every flush, five times a second
        while True:
            await asyncio.sleep(FLUSH_S)
            try:
                self.core.flush()
            except Exception as exc:
                if not failing:
                    log.error("cannot write the store (%s); acks wait and the flush is retried every %.1f s",
                              exc, FLUSH_S)
                failing = True
                continue
            if failing:
                log.warning("the store takes writes again; waiting acks are sent")
                failing = False
            self.ingest.flushed()

    async def stop(self) -> None:
        if self._registry is not None:
            await self._registry.stop()
        if self._flusher is not None:
            self._flusher.cancel()
        if self._query_server is not None:
            await self._query_server.stop(grace=1.0)
        if self._server is not None:
            await self._server.stop(grace=2.0)
        try:
            self.core.flush()
        except Exception as exc:  # kept for the agents to resend: what was not acked is not lost
            log.error("stopping with writes the store refused (%s); agents resend what was not acknowledged", exc)
        self.alerting.close()
        if self.resumer is not None:
            self.resumer.close()
        for httpd in (self._httpd, self._web):
            if httpd is not None:
                httpd.shutdown()
                httpd.server_close()
