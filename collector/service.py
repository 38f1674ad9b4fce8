"""gRPC servicers (thin: messages in, calls to the core out) and the collector's main coroutine."""
from __future__ import annotations

import asyncio
import gc
import json
import logging
import signal
import time

import grpc
from clusterwatch.v1 import agent_pb2, agent_pb2_grpc, query_pb2, query_pb2_grpc

from clusterwatch.errors import ConfigError

from .agent_auth import TokenInterceptor, certificate_node_names, node_identity_error, open_ingest_warning
from .alerting import Alerting
from .alerts import AlertStore
from .config import CollectorConfig
from .core import CollectorCore
from .exporter import ClusterCollector, Exposition, serve_metrics
from .grpc_guard import MalformedMessageInterceptor, peer_host, say_once
from .grpc_limits import connection_caps, raise_open_file_limit, server_options
from .listen_check import taken_error
from .query_auth import (
    MUNGE_RETRY_S,
    AuthError,
    AwaitingMunge,
    Caller,
    MungeAuth,
    NoAuth,
    munge_installed,
    munge_works,
)
from .rules import load_rules
from .store import Store, open_db
from .trace import job_trace_lines
from .views import DEFAULT_TREND_POINTS, job_info, job_view

log = logging.getLogger("clusterwatch.collector")

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
TICK_S = 1.0
# One agent's batch holds its node's processes: thousands at most. More is a bug or an attack.
MAX_SAMPLES_PER_BATCH = 50_000
# A node polled every second with a thousand processes sends 1,000 samples/s; fifty times that
# from one stream is a flood, slowed down so it cannot starve the other agents.
MAX_SAMPLES_PER_S_PER_AGENT = 50_000.0
# An agent sends its Hello as soon as its stream opens; a stream silent this long is closed.
HELLO_TIMEOUT_S = 20.0
# Acks wait for the store: a batch is acknowledged only once durable (at most this late).
FLUSH_S = 0.2
# Net allocations of container objects between two young-generation garbage collections (CPython's
# default is 700). See tune_gc.
GC_YOUNG_THRESHOLD = 50_000

def tune_gc() -> None:
    """Make the cyclic garbage collector cheap for the collector's heap, once it is built.

    The collector keeps a large heap for hours (history, rule state, jobs) and makes many small
    objects a batch that reference counting frees at once; with CPython's defaults the cyclic
    collector scans the young objects every few batches and, every so often, the whole heap:
    about a tenth of ingest CPU (bench/bench_ingest.py). Scans 70 times rarer leave the few
    cycles the collector makes (asyncio and gRPC internals) bounded, and what exists at start-up
    (modules, the restored store) is frozen out of every scan.
    """
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 20)  # the older generations half as often as by default


class TokenBucket:
    """Allows `rate` samples a second on average, bursts of `burst_s` seconds' worth.

    `take` returns how long the caller should wait before going on (0 when within budget).
    """

    def __init__(self, rate: float, burst_s: float) -> None:
        self.rate = rate
        self.capacity = rate * burst_s
        self.tokens = self.capacity
        self.last = time.monotonic()

    def take(self, n: int, now: float) -> float:
        self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)
        self.last = now
        self.tokens -= n
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


async def _hello_in_time(request_iterator, context, counters):
    """The stream's messages; the first must come within HELLO_TIMEOUT_S (an agent sends its Hello at once).

    A stream that opens and says nothing would otherwise hold its connection for ever.
    """
    messages = request_iterator.__aiter__()
    try:
        first = await asyncio.wait_for(messages.__anext__(), HELLO_TIMEOUT_S)
    except StopAsyncIteration:
        return
    except asyncio.TimeoutError:
        counters.rejected += 1
        await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                            f"no hello within {HELLO_TIMEOUT_S:.0f} s of opening the stream")
    yield first
    async for msg in messages:
        yield msg


class IngestServicer(agent_pb2_grpc.IngestServicer):
    """One stream per agent: a Hello, then batches; each stored batch is acknowledged."""

    def __init__(self, core: CollectorCore, max_samples_per_s: float = MAX_SAMPLES_PER_S_PER_AGENT) -> None:
        self.core = core
        self.max_samples_per_s = max_samples_per_s
        # node → queue of messages (acks, signal requests) to push to that node's agent
        self.outboxes: dict[str, asyncio.Queue] = {}
        # acks held until the next durable flush
        self.after_flush: list[tuple[asyncio.Queue, agent_pb2.CollectorMessage]] = []
        # hellos refused because the agent's certificate does not name the node it speaks for
        self.identity_refused = 0

    def counter_values(self) -> dict[str, tuple[float, str]]:
        return {"clusterwatch_ingest_identity_refused": (
            self.identity_refused, "Agent streams refused: the client certificate does not name the hello's node.")}

    async def Stream(self, request_iterator, context):
        # the token, when there is one, was checked by TokenInterceptor before this
        outbox: asyncio.Queue = asyncio.Queue()
        reader = asyncio.ensure_future(self._read(request_iterator, context, outbox))
        reader.add_done_callback(lambda _: outbox.put_nowait(None))
        try:
            while True:
                msg = await outbox.get()
                if msg is None:
                    break
                yield msg
            exc = reader.exception() if reader.done() and not reader.cancelled() else None
            if exc is not None:
                raise exc
            # The agent half-closed its side: its last batches are stored but their acks wait for
            # the next durable flush. Deliver them before ending the stream, or they would be resent.
            while any(box is outbox for box, _ in self.after_flush):
                await asyncio.sleep(FLUSH_S / 4)
            while not outbox.empty():
                msg = outbox.get_nowait()
                if msg is not None:
                    yield msg
        finally:
            reader.cancel()

    async def _read(self, request_iterator, context, outbox: asyncio.Queue) -> None:
        """Store each batch; its ack is queued once the flusher has made it durable."""
        node = boot_id = None
        bucket = TokenBucket(self.max_samples_per_s, burst_s=10.0)
        try:
            async for msg in _hello_in_time(request_iterator, context, self.core.counters):
                kind = msg.WhichOneof("body")
                if kind == "hello":
                    if not msg.hello.node:
                        self.core.counters.rejected += 1
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "hello without a node name")
                    refusal = node_identity_error(msg.hello.node, certificate_node_names(context.auth_context()))
                    if refusal is not None:
                        self.identity_refused += 1
                        self.core.counters.unauthenticated += 1
                        peer = peer_host(context.peer())
                        say_once(f"identity {peer} {msg.hello.node}", "stream from %s refused: %s", peer, refusal)
                        await context.abort(grpc.StatusCode.PERMISSION_DENIED, refusal)
                    node, boot_id = self.core.hello(msg.hello), msg.hello.boot_id
                    self.outboxes[node] = outbox
                elif kind == "batch":
                    if node is None:
                        self.core.counters.rejected += 1
                        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "a batch before the hello")
                    n = len(msg.batch.processes.pid)
                    if n > MAX_SAMPLES_PER_BATCH:
                        self.core.counters.rejected += 1
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                            f"a batch of {n} process samples; at most {MAX_SAMPLES_PER_BATCH}")
                    # a flooding agent is slowed down (its acks come later), never allowed to starve the rest
                    delay = bucket.take(n, time.monotonic())
                    if delay > 0:
                        self.core.counters.throttled += 1
                        await asyncio.sleep(delay)
                    self.core.batch(node, boot_id, msg.batch)  # a refused batch is acked too, or resent forever
                    ack = agent_pb2.CollectorMessage(ack=agent_pb2.Ack(seq=msg.batch.seq))
                    self.after_flush.append((outbox, ack))
                else:
                    self.core.counters.rejected += 1
        finally:
            if node is not None:
                if self.outboxes.get(node) is outbox:
                    del self.outboxes[node]
                self.core.disconnected(node)

    def flushed(self) -> None:
        """The flusher made everything durable: release the acks that waited for it."""
        waiting, self.after_flush = self.after_flush, []
        for outbox, ack in waiting:
            outbox.put_nowait(ack)

    def send_signal(self, node: str, pid: int, start_time: float, signum: int, reason: str) -> bool:
        """Queue a signal request for a node's agent; False when that agent is not connected."""
        outbox = self.outboxes.get(node)
        if outbox is None:
            return False
        req = agent_pb2.SignalRequest(pid=pid, start_time=start_time, signal=signum, reason=reason)
        outbox.put_nowait(agent_pb2.CollectorMessage(signal=req))
        return True


class QueryServicer(query_pb2_grpc.QueryServicer):
    """Read-only answers for `clusterwatch status`, `jobs` and `alerts`, to the users allowed to see them."""

    def __init__(self, core: CollectorCore, auth=None) -> None:
        self.core = core
        self.auth = auth or NoAuth()

    async def _caller(self, context) -> Caller:
        try:
            return await self.auth.caller(context.invocation_metadata())
        except AuthError as exc:
            self.core.counters.unauthenticated += 1
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))

    async def _check_job(self, context, caller: Caller, job_id: str, owner: str) -> None:
        if not caller.may_see(owner):
            # whose it is is not the caller's business either: the owner is not named
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"job {job_id} is not yours; this collector shows each user only their own jobs")

    async def GetJob(self, request, context):
        core = self.core
        caller = await self._caller(context)
        points = request.trend_points or DEFAULT_TREND_POINTS
        with core.lock:
            job = core.state.jobs.get(request.job_id)
            view = None
            if job is not None:
                view = job_view(core.state, job, core.clock(), min(points, 400),
                                core.config.agent_down_after_intervals)
        if view is None:
            stored = core.store.load_summary(request.job_id)
            if stored is not None:
                view = query_pb2.JobView()
                view.ParseFromString(stored)
                view.now = core.clock()
                await self._check_job(context, caller, request.job_id, view.job.user)
                return view
        if view is not None:
            await self._check_job(context, caller, request.job_id, view.job.user)
            if core.alert_views is not None:
                view.alerts.extend(core.alert_views(request.job_id))
            return view
        await context.abort(grpc.StatusCode.NOT_FOUND,
                            f"job {request.job_id} is unknown to this collector (no agent reported it)")

    async def ListJobs(self, request, context):
        core = self.core
        caller = await self._caller(context)
        resp = query_pb2.ListJobsResponse()
        with core.lock:
            live = {j.job_id: j for j in core.state.jobs.values()}
            for job in live.values():
                if (request.include_ended or not job.ended) and caller.may_see(job.user):
                    resp.jobs.append(job_info(job))
        if request.include_ended:
            for job in core.store.load_jobs(include_ended=True):
                if job.job_id not in live and caller.may_see(job.user):
                    resp.jobs.append(job_info(job))
        visible = {j.job_id for j in resp.jobs}
        if core.alert_list is not None:
            for job_id, view in core.alert_list(None, False, 10_000):
                if view.state == "firing" and job_id in visible:
                    resp.firing_alerts[job_id] = resp.firing_alerts.get(job_id, 0) + 1
        return resp


    async def ListAlerts(self, request, context):
        core = self.core
        caller = await self._caller(context)
        resp = query_pb2.ListAlertsResponse()
        if core.alert_list is None:
            return resp
        owners = self._owners() if not caller.admin else {}
        for job_id, view in core.alert_list(request.job_id or None, request.include_resolved,
                                            request.limit or 200):
            # node-wide alerts (agent_down, idle GPUs without a job) are for admins
            if caller.admin or (job_id and caller.may_see(owners.get(job_id, ""))):
                resp.alerts.add(job_id=job_id, alert=view)
        return resp

    def _owners(self) -> dict[str, str]:
        core = self.core
        with core.lock:
            owners = {j.job_id: j.user for j in core.state.jobs.values()}
        for job in core.store.load_jobs(include_ended=True):
            owners.setdefault(job.job_id, job.user)
        return owners

    async def GetTrace(self, request, context):
        core = self.core
        caller = await self._caller(context)
        with core.lock:
            job = core.state.jobs.get(request.job_id)
            lines = job_trace_lines(core.state, job) if job is not None else None
            owner = job.user if job is not None else ""
        if lines is not None:
            await self._check_job(context, caller, request.job_id, owner)
        if lines is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"job {request.job_id} is not running on this collector; a trace can only be "
                                "recorded while the collector holds the job's samples")
        for i in range(0, len(lines), 5000):
            yield query_pb2.TraceChunk(lines=lines[i:i + 5000])


def _server_credentials(config: CollectorConfig) -> grpc.ServerCredentials | None:
    if not config.tls_cert:
        return None
    with open(config.tls_cert, "rb") as f:
        cert = f.read()
    with open(config.tls_key, "rb") as f:
        key = f.read()
    ca = None
    if config.tls_client_ca:
        with open(config.tls_client_ca, "rb") as f:
            ca = f.read()
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)


# gRPC's default SO_REUSEPORT let a second collector bind a running one's port and take some of its
# agents; one collector a port (collector/listen_check.py).
NO_REUSEPORT = ("grpc.so_reuseport", 0)


def _bind(server: grpc.aio.Server, listen: str, flag: str, creds: grpc.ServerCredentials | None) -> int:
    """Add the port `listen` to `server`; the port bound, or ConfigError in one line when it cannot be."""
    try:
        port = server.add_insecure_port(listen) if creds is None else server.add_secure_port(listen, creds)
    except RuntimeError:  # taken in between, or an address gRPC cannot use
        port = 0
    if not port:
        raise ConfigError(f"cannot listen on {listen} ({flag}); is another collector using the port?")
    return port


class CollectorServer:
    """The running collector: gRPC server, Prometheus endpoint, periodic tick."""

    def __init__(self, config: CollectorConfig) -> None:
        self.config = config
        rules = load_rules(config.rules_path)  # a bad rules file stops the start with one line
        conn = open_db(config.db_path)
        self.core = CollectorCore(config, Store(conn))
        self.ingest = IngestServicer(self.core, config.agent_rate_limit)
        # a leak bucket must see a sample: look at least three times a bucket (short demo buckets too)
        buckets = (rules.gpu_memory_leak.bucket_s, rules.host_memory_leak.bucket_s, rules.handle_leak.bucket_s)
        self.alerting = Alerting(rules, self.core.state, AlertStore(conn), send_signal=self.ingest.send_signal,
                                 min_interval_s=min(config.rules_interval_s, min(buckets) / 3))
        core = self.core
        core.on_samples.append(self.alerting.on_samples)
        core.on_job_closed.append(self.alerting.on_job_closed)
        core.on_provenance.append(self.alerting.on_provenance)
        core.on_tick.append(self.alerting.tick)
        core.alert_views = self.alerting.alert_views
        core.alert_list = self.alerting.alert_list
        running = {n for j in core.state.jobs.values() if not j.ended for n in j.nodes}
        self.alerting.restore_nodes([(n, seen, n in running) for n, seen in core.store.load_node_times()])
        self.grpc_port = 0
        self.metrics_port = 0
        self._server: grpc.aio.Server | None = None
        self._httpd = None
        self._flusher: asyncio.Future | None = None
        self._query_server: grpc.aio.Server | None = None
        self.query_port = 0
        self._query_cap = 0
        self._registry = None

    async def start(self) -> None:
        # a taken port stops the start before anything else is said or opened
        for listen, flag in ((self.config.listen, "--listen"), (self.config.query_listen, "--query-listen")):
            problem = taken_error(listen, flag) if listen else None
            if problem is not None:
                raise ConfigError(problem)
        tune_gc()
        warning = open_ingest_warning(self.config.listen, self.config.token, self.config.tls_client_ca)
        if warning:
            log.warning("%s", warning)
        interceptors = []
        if self.config.token:
            interceptors.append(TokenInterceptor(self.config.token, self._count_unauthenticated))
        interceptors.append(MalformedMessageInterceptor(self._count_rejected))
        fd_limit = raise_open_file_limit()
        main_cap, self._query_cap = connection_caps(fd_limit, bool(self.config.query_listen))
        server = grpc.aio.server(interceptors=interceptors, options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
            NO_REUSEPORT,
            *server_options(main_cap),
        ])
        agent_pb2_grpc.add_IngestServicer_to_server(self.ingest, server)
        query = QueryServicer(self.core, await self._query_auth())
        query_pb2_grpc.add_QueryServicer_to_server(query, server)
        self.grpc_port = _bind(server, self.config.listen, "--listen", _server_credentials(self.config))
        await server.start()
        self._server = server
        if self.config.query_listen:
            await self._start_query_server(query)
        if self.config.slurm:
            from .registry import build_registry

            self._registry = build_registry(self.core, self.config)
            self._registry.start()
        self._flusher = asyncio.ensure_future(self._flush_loop())
        if self.config.metrics_listen:
            self._start_metrics()
        if self.config.ports_file:
            with open(self.config.ports_file + ".tmp", "w") as f:
                json.dump({"grpc": self.grpc_port, "metrics": self.metrics_port, "query": self.query_port}, f)
            import os

            os.replace(self.config.ports_file + ".tmp", self.config.ports_file)

    def _count_unauthenticated(self) -> None:
        self.core.counters.unauthenticated += 1

    def _count_rejected(self) -> None:
        self.core.counters.rejected += 1

    def counter_values(self) -> dict[str, tuple[float, str]]:
        """The core's ingest counters, the service's own and the job registry's, for /metrics."""
        values = {**self.core.counter_values(), **self.ingest.counter_values()}
        if self._registry is not None:
            values["clusterwatch_slurm_records_skipped"] = (
                self._registry.records_skipped,
                "Slurm job records left out because their values could forge another record's lines.")
        return values

    async def _start_query_server(self, query: QueryServicer) -> None:
        """The query service alone on --query-listen: TLS without client certificates when TLS is on."""
        server = grpc.aio.server(interceptors=[MalformedMessageInterceptor(self._count_rejected)],
                                 options=[NO_REUSEPORT, *server_options(self._query_cap)])
        query_pb2_grpc.add_QueryServicer_to_server(query, server)
        cfg = self.config
        creds = None
        if cfg.tls_cert:
            with open(cfg.tls_cert, "rb") as f:
                cert = f.read()
            with open(cfg.tls_key, "rb") as f:
                key = f.read()
            creds = grpc.ssl_server_credentials([(key, cert)])
        self.query_port = _bind(server, cfg.query_listen, "--query-listen", creds)
        await server.start()
        self._query_server = server

    async def _query_auth(self):
        """The query service's authentication, as configured (auto: munge where it is installed)."""
        cfg = self.config
        if cfg.query_auth == "none":
            return NoAuth()
        munge = MungeAuth(frozenset(cfg.query_admins), cfg.show_all_jobs, cfg.munge_socket)
        if await munge_works(cfg.munge_socket):
            return munge
        if cfg.query_auth == "munge":
            raise ConfigError("--query-auth munge, but munge does not work on this host (munge/unmunge "
                              "missing or munged not running); start munged or pass --query-auth none")
        if munge_installed():
            # installed but not answering: munged is down or not up yet. Never open every job to everyone
            # meanwhile; a query tries again, and munged coming up is picked up.
            log.warning("munge is installed but does not work on this host (munged not running?): queries are "
                        "refused until it does, tried again every %.0f s; start munged, or pass --query-auth "
                        "none to show every job to anyone who reaches %s", MUNGE_RETRY_S, cfg.listen)
            return AwaitingMunge(munge, lambda: munge_works(cfg.munge_socket))
        log.warning("queries are not authenticated (munge is not installed on this host): anyone who reaches "
                    "%s sees every job; install and run munged, or keep the collector on loopback", cfg.listen)
        return NoAuth()

    def _start_metrics(self) -> None:
        # A scrape copies what it exports under the core's lock (ingest writes the state under it)
        # and writes the text outside it (collector/exporter.py).
        exposition = Exposition(ClusterCollector(
            self.core.state, self.core.clock, self.config.per_process_metrics,
            counters=self.counter_values, alerts=self.active_alerts,
            after_intervals=self.config.agent_down_after_intervals,
        ), self.core.lock)
        host, _, port = self.config.metrics_listen.rpartition(":")
        self._httpd = serve_metrics(exposition, host.strip("[]") or "127.0.0.1", int(port))
        self.metrics_port = self._httpd.server_port

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
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
