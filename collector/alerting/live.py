"""The live side of the rules: state changes in, engine observations out, alerts stored and acted on.

The engine (collector/rules) is pure and knows nothing of the collector; this module
feeds it the observations of each stored batch (its processes, GPUs and node, built by
collector/state/observations.py), tells the engine when processes and jobs go away, raises
`code_mismatch` from provenance, and hands every event to the alert table and the actions.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from clusterwatch.humanize import duration
from clusterwatch.model import ProcessKey

from ..health.engine import HealthEngine
from ..health.live import HealthListener
from ..health.xid_catalog import load_catalog
from ..rules import Engine, RuleSet
from ..rules.engine import ENDED_WHILE_FIRING
from ..rules.model import FIRING, RESOLVED, AlertEvent, GpuClockObservation, NodeHeartbeat
from ..state.cluster import ClusterState, JobState, ProcessSeries
from ..state.core import CoreListener
from ..state.observations import node_observations
from .actions import Dispatcher
from .alerts import Alert, AlertStore
from .slowdown_host import HostSide
from .stall_causes import HealthCauses
from .stall_stacks import StallStacks

log = logging.getLogger("clusterwatch.collector")

#: How often the alerts held are brought up to date (their text and figures, as of the latest samples).
#: Every rule works in minutes and every text in minutes at the finest, so a few seconds late is current.
REFRESH_EVERY_S = 10.0
#: A health alert that names no job (any health rule's, on a GPU no job's process used) has no job end to
#: resolve it: it resolves once its GPU has answered healthy (its counters read, not lost, no memory errors
#: over the thresholds, not throttled, its links quiet) for this long after its last finding,
#: or, for a GPU that sends no health counters (or one not heard of since a restart), this long after the
#: alert was last raised. A GPU that stays lost keeps its alert.
HEALTH_CLEAR_S = 600.0
HEALTH_CLEAR_UNREAD_S = 3600.0


class Alerting(CoreListener):
    """Runs the rule engine on the collector's state.

    Args:
        rules: the rule set (from the rules file).
        state: the collector's state (read under the collector's lock by the caller).
        store: the alert table.
        send_signal: delivers a signal to a process through its node's agent.
        min_interval_s: a process is observed at most this often. Every rule works in minutes,
            so a node polled every second costs the engine what one polled every 5 s does.
        dispatcher: the alert actions (the collector's service builds them with what they reach);
            None: a Dispatcher of `rules.actions` that sends signals through `send_signal`.
        health: the GPU health rules' listener, whose alerts it handles (the service builds it around the
            engine the core reads for traces, with the kernel-log marks of the store); None: one over the
            shipped XID catalogue, its marks in memory only.
    """

    def __init__(self, rules: RuleSet, state: ClusterState, store: AlertStore,
                 send_signal: Callable[[str, int, float, int, str], bool] | None = None,
                 min_interval_s: float = 5.0, dispatcher: Dispatcher | None = None,
                 health: HealthListener | None = None) -> None:
        self.rules = rules
        self.state = state
        self.store = store
        # a stall names its likely cause: what the engine holds, and the health findings on the job's GPUs
        # a slow job names its likely cause too: its ranks' host side is the collector's state's, its fabric the
        # health engine's
        health_engine = lambda: self.health.engine  # noqa: E731 (self.health is set below)
        self.engine = Engine(rules, causes=HealthCauses(state, health_engine), host=HostSide(state, health_engine))
        self.dispatcher = dispatcher if dispatcher is not None else Dispatcher(store, rules.actions,
                                                                               send_signal=send_signal)
        # a stalled job's stacks, once, through the process asker the collector gives the dispatcher
        self.stall_stacks = StallStacks(store, lambda: self.dispatcher.ask_train, rules.training_stall.take_stacks)
        self._observed: dict[str, set[ProcessKey]] = {}
        self._mismatch: dict[str, str] = {}  # job id → the code ids it was raised for
        self.min_interval_s = min_interval_s
        self._told_batches: set[str] = set()  # nodes whose batches come further apart than the rules' looks
        self._refreshed = float("-inf")  # when the alerts' figures were last brought up to date
        # GPU UUID → the running job it is allocated to; rebuilt every tick, not every batch
        self._gpu_owner: dict[str, str] = {}
        # gpu_xid, gpu_lost, gpu_memory_errors, gpu_throttle, gpu_link_errors: from the agents' health records
        self.health = health if health is not None else HealthListener(HealthEngine(load_catalog()), state,
                                                                        self.handle)

    # -- feeding the engine ---------------------------------------------------------------------

    def _tell_if_batches_too_far_apart(self, node: str) -> None:
        """Say once when the rules see a node's processes less often than they want to look: each batch's latest
        sample and the history points between (a point every history step) are what they see, where replay sees
        every sample kept; a rules file with short leak buckets (a demo's, a test's) is then told later live."""
        ns = self.state.nodes.get(node)
        if ns is None:
            return
        seen_every = min(ns.send_interval_s, self.state.history_step_s)
        if seen_every <= self.min_interval_s * 1.5:
            return
        self._told_batches.add(node)
        log.warning("node %s: the rules want a look at each process every %.2g s (the shortest leak bucket over 3, "
                    "or --rules-interval), but its agent sends a batch every %.2g s and history keeps a point every "
                    "%.2g s: live they see one sample every %.2g s; give its agent --send-interval %.2g or less, or "
                    "lengthen the rules file's buckets", node, self.min_interval_s, ns.send_interval_s,
                    self.state.history_step_s, seen_every, self.min_interval_s)

    def on_samples(self, node: str, touched: list[ProcessSeries], now: float) -> None:
        """One batch of a node was stored: observe its processes, GPUs and the node itself."""
        if node not in self._told_batches:
            self._tell_if_batches_too_far_apart(node)
        seen = node_observations(self.state, node, touched, self._gpu_owner, now, self.min_interval_s)
        engine = self.engine
        events: list[AlertEvent] = []
        observe = engine.observe
        for obs in seen.processes:
            found = observe(obs)
            if found:
                events.extend(found)
        # processes of this node that were watched and are gone now
        live = {series.key for series in touched}
        for key in self._observed.get(node, set()) - live:
            series = self.state.processes.get(key)
            if series is None or not series.alive:
                events.extend(engine.forget_process(key.node, key.pid, key.start_time, now))
            else:
                live.add(key)
        self._observed[node] = live
        for gpu in seen.gpus:
            found = engine.observe_gpu(gpu)
            if found:
                events.extend(found)
        events.extend(engine.heartbeat(seen.heartbeat))
        if events:
            self.handle(events, now)

    def on_health(self, node: str, batch, now: float) -> None:
        """A batch brought GPU health records: the health rules' events go the way of the others."""
        self.health.on_health(node, batch, now)
        # job_slowdown reads each GPU's clock-event reasons and temperature: which GPU holds its job back
        events: list[AlertEvent] = []
        for c in batch.gpu_health:
            gs = self.state.gpus.get(c.uuid)
            events += self.engine.observe_gpu_clocks(GpuClockObservation.of_reading(
                node, c, self._gpu_owner.get(c.uuid, ""), gs.info.index if gs is not None else None))
        self.handle(events, now)

    def health_views(self, job_id: str) -> list:
        """The health findings on the job's GPUs during the job and those still standing from before it, worst
        first, for `status` and the job page."""
        job = self.state.jobs.get(job_id)
        return self.health.job_health(job) if job is not None else []

    def on_job_closed(self, job: JobState, now: float) -> None:
        """A job ended: its alerts resolve (the engine's and any restored from before a restart)."""
        events = list(self.engine.forget_job(job.job_id, now))
        for a in self.store.active(job_id=job.job_id):
            if not any(e.key == a.key for e in events):
                events.append(_resolved(a, now, f"job {job.job_id} ended"))
        self._mismatch.pop(job.job_id, None)
        self.handle(events, now)
        self.stall_stacks.forget_job(job.job_id)

    def on_provenance(self, job: JobState, now: float) -> None:
        """Ranks of a job reported their code: raise code_mismatch when they differ."""
        rule = self.rules.code_mismatch
        if not rule.enabled:
            return
        groups: dict[str, list[ProcessKey]] = {}
        for key, record in job.provenance.items():
            code = record.get("code_id") or "unknown"
            if code != "unknown":
                groups.setdefault(code, []).append(key)
        signature = ",".join(sorted(groups))
        if len(groups) < 2 or self._mismatch.get(job.job_id) == signature:
            return
        self._mismatch[job.job_id] = signature
        minority = min(groups.values(), key=len)
        ranks = []
        for key in minority:
            series = self.state.processes.get(key)
            rank = series.latest.rank if series is not None else None
            ranks.append(f"rank {rank}" if rank is not None else f"pid {key.pid}")
        event = AlertEvent(
            t=now, rule="code_mismatch", state=FIRING, severity=rule.severity, node=minority[0].node,
            job_id=job.job_id, description=(f"ranks of job {job.job_id} run {len(groups)} different versions of "
                                            f"the code ({', '.join(ranks)} differ from the rest)"),
            figures={"versions": len(groups), "code_ids": sorted(groups)})
        self.handle([event], now)

    def on_tick(self, now: float) -> None:
        self._gpu_owner = self.state.gpu_allocations()
        self.handle(self.engine.tick(now), now)
        if now - self._refreshed >= REFRESH_EVERY_S:
            self.refresh(now)
        self.dispatcher.tick(now)

    def refresh(self, now: float) -> int:
        """Bring every alert the engine holds up to date: its text and figures as of the latest samples
        (status, /alerts and a later escalation step read them from the table). Returns the rows changed."""
        self._refreshed = now
        self._clear_jobless_health(now)
        changed = 0
        for ev in self.stall_stacks.merge(self.engine.refresh(now)):
            try:
                changed += self.store.refresh(ev)
            except Exception:  # a refresh that fails must not stop the tick; the next one tries again
                log.exception("alert refresh failed")
                break
        return changed

    def _clear_jobless_health(self, now: float) -> None:
        """Resolve the health alerts that name no job once their GPU has answered healthy (HEALTH_CLEAR_S)."""
        from ..health.engine import HEALTH_RULES

        engine = self.health.engine
        events = []
        for a in self.store.active():
            if a.job_id or a.rule not in HEALTH_RULES:
                continue
            view = engine.gpus.get((a.node, a.gpu))
            last = max([a.started_at, *(t for t, _ in view.findings)] if view is not None else [a.started_at])
            msg = view.counters if view is not None else None
            if msg is not None:
                if view.lost or view.memory_signature or view.throttling or view.link_errors \
                        or msg.time - last < HEALTH_CLEAR_S:
                    continue
                why = f"GPU {a.gpu} on {a.node} has answered healthy for {duration(msg.time - last)}"
            elif (view is not None and view.lost) or now - (a.updated_at or a.started_at) < HEALTH_CLEAR_UNREAD_S:
                continue
            else:
                why = f"nothing new on GPU {a.gpu} of {a.node} for {duration(now - (a.updated_at or a.started_at))}"
            events.append(AlertEvent(t=msg.time if msg is not None else now, rule=a.rule, state=RESOLVED,
                                     severity=a.severity, node=a.node, job_id="", pid=a.pid,
                                     start_time=a.start_time, gpu=a.gpu, rank=a.rank,
                                     description=f"{a.description} (resolved: {why})", figures=dict(a.figures)))
        self.handle(events, now)

    def restore_nodes(self, nodes: list[tuple[str, float, bool]]) -> None:
        """After a restart: nodes as last seen, so a node whose agent never comes back raises agent_down."""
        for node, last_seen, has_jobs in nodes:
            self.engine.heartbeat(NodeHeartbeat(last_seen, node, has_jobs))

    def handle(self, events: list[AlertEvent], now: float) -> None:
        if not events:
            return
        try:
            changed = self.dispatcher.process(self.stall_stacks.merge(events), now)
        except Exception:  # an action that fails must not stop ingest
            log.exception("alert actions failed")
            return
        for a in changed:
            log.info("alert %s %s: %s", a.rule, a.state, a.description)
        try:
            self.stall_stacks.on_changed(changed, now)
        except Exception:  # as an action: never in the way of ingest
            log.exception("stall stacks failed")

    # -- reading ----------------------------------------------------------------------------------

    def active(self, job_id: str | None = None) -> list[Alert]:
        return self.store.active(job_id=job_id)

    def alert_views(self, job_id: str, limit: int = 50) -> list:
        """The job's alerts for `status`: active ones, then the latest resolved."""
        return [view for _, view in self.alert_list(job_id, True, limit)]

    def alert_list(self, job_id: str | None, include_resolved: bool, limit: int) -> list[tuple[str, object]]:
        """(job id, AlertView) pairs, active first, then (if asked) the latest resolved."""
        from clusterwatch.v1 import query_pb2

        alerts = self.store.active(job_id=job_id)
        if include_resolved:
            alerts += self.store.history(limit=limit, job_id=job_id)
        out = []
        seen = set()
        for a in alerts:
            if a.id in seen or len(out) >= limit:
                continue
            seen.add(a.id)
            av = query_pb2.AlertView(
                rule=a.rule, state=a.state, severity=a.severity, node=a.node, pid=max(a.pid, 0), gpu=a.gpu,
                since=a.started_at, fired_at=a.fired_at or 0.0, resolved_at=a.resolved_at or 0.0,
                description=a.description)
            if a.rank is not None:
                av.rank = a.rank
            if a.state == RESOLVED and a.figures.get("ended_while_firing"):
                av.ended_while_firing = True
            _cause_into(av, a.figures)
            out.append((a.job_id, av))
        return out

    def exported(self) -> list[dict]:
        """Active alerts as label dicts for /metrics."""
        return [{"rule": a.rule, "severity": a.severity, "state": a.state, "job_id": a.job_id, "node": a.node,
                 "rank": str(a.rank) if a.rank is not None else (f"pid{a.pid}" if a.pid >= 0 else "")}
                for a in self.store.active()]

    def close(self) -> None:
        self.dispatcher.close()
        self.stall_stacks.close()


def _cause_into(av, figures: dict) -> None:
    """A stall's likely cause (rules/causes.py's figures) into its AlertView."""
    cause = figures.get("cause")
    if not isinstance(cause, str) or not cause:
        return
    av.cause = cause
    av.cause_node = str(figures.get("cause_node") or "")
    av.cause_gpu = str(figures.get("cause_gpu") or "")
    for name in ("cause_rank", "cause_xid"):
        value = figures.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            setattr(av, name, value)


def _resolved(a: Alert, t: float, why: str) -> AlertEvent:
    """An alert of the table that the engine does not hold (restored from before a restart), resolved because
    its job ended: one that was firing ended while firing, with its last figures."""
    if a.state == FIRING:
        return AlertEvent(t=t, rule=a.rule, state=RESOLVED, severity=a.severity, node=a.node, job_id=a.job_id,
                          pid=a.pid, start_time=a.start_time, gpu=a.gpu, rank=a.rank,
                          description=f"{a.description}; {ENDED_WHILE_FIRING}: {why}",
                          figures=dict(a.figures, ended_while_firing=True))
    return AlertEvent(t=t, rule=a.rule, state=RESOLVED, severity=a.severity, node=a.node, job_id=a.job_id,
                      pid=a.pid, start_time=a.start_time, gpu=a.gpu, rank=a.rank,
                      description=f"{a.description} (resolved: {why})")
