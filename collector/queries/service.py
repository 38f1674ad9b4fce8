"""The users' side of the collector: read-only answers for `status`, `jobs`, `alerts` and `record`."""
from __future__ import annotations

import grpc
from clusterwatch.v1 import query_pb2, query_pb2_grpc

from ..alerting.train_asks import KINDS, TrainAsks, targets
from ..state.core import AlertSource, CollectorCore
from . import action_rights
from .auth import AuthError, Caller, NoAuth
from .views import DEFAULT_TREND_POINTS, counts_as_firing

# A view's trends are drawn in a terminal: more points than a wide one has columns is wasted work.
MAX_TREND_POINTS = 400
def stack_groups(answers) -> list[str]:
    """The ranks' stacks grouped (clusterwatch/stacks.py): ranks with the same stack said once, with their count."""
    from clusterwatch.stacks import by_rank, summarize

    dumps, noun = by_rank(answers)
    return summarize(dumps, noun) if dumps else []


# Trace lines a message: well under gRPC's message limit at the longest lines a sample makes.
TRACE_CHUNK_LINES = 5000


class QueryServicer(query_pb2_grpc.QueryServicer):
    """Read-only answers for `clusterwatch status`, `jobs` and `alerts`, to the users allowed to see them.

    Args:
        core: the collector core, asked for jobs, views and traces.
        auth: who is asking (query_auth); None: everyone sees everything.
        alerts: the alerts of jobs; None: no alerts are shown.
        asks: requests to training processes and their answers (collector/alerting/train_asks.py); None: AskTraining
            is refused.
        unauthenticated_actions: without query authentication, every caller may ask every job's processes
            (--allow-unauthenticated-actions); False: AskTraining is refused to them (action_rights.py).
    """

    def __init__(self, core: CollectorCore, auth=None, alerts: AlertSource | None = None,
                 asks: TrainAsks | None = None, unauthenticated_actions: bool = False) -> None:
        self.core = core
        self.auth = auth or NoAuth()
        self.alerts = alerts
        self.asks = asks
        self.unauthenticated_actions = unauthenticated_actions

    async def _caller(self, context) -> Caller:
        try:
            return await self.auth.caller(context.invocation_metadata())
        except AuthError as exc:
            self.core.count("unauthenticated")
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))

    async def _check_job(self, context, caller: Caller, job_id: str, owner: str) -> None:
        if not caller.may_see(owner):
            # whose it is is not the caller's business either: the owner is not named
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"job {job_id} is not yours; this collector shows each user only their own jobs")

    async def GetJob(self, request, context):
        caller = await self._caller(context)
        points = min(request.trend_points or DEFAULT_TREND_POINTS, MAX_TREND_POINTS)
        view = self.core.live_job_view(request.job_id, points)
        if view is None:
            view = self.core.stored_job_view(request.job_id)
            if view is not None:
                await self._check_job(context, caller, request.job_id, view.job.user)
                return view  # its alerts were stored with it
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"job {request.job_id} is unknown to this collector (no agent reported it)")
        await self._check_job(context, caller, request.job_id, view.job.user)
        if self.alerts is not None:
            view.alerts.extend(self.alerts.alert_views(request.job_id))
            health = getattr(self.alerts, "health_views", None)
            if health is not None:
                view.health.extend(health(request.job_id))
        if self.asks is not None:
            view.train_answers.extend(self.asks.latest(request.job_id))
        return view

    async def ListJobs(self, request, context):
        caller = await self._caller(context)
        resp = query_pb2.ListJobsResponse()
        resp.jobs.extend(self.core.job_infos(request.include_ended, caller.may_see))
        visible = {j.job_id for j in resp.jobs}
        if self.alerts is not None:  # an ended job's count is what it ended with, as its page's badge has it
            for job_id, view in self.alerts.alert_list(None, True, 10_000):
                if counts_as_firing(view) and job_id in visible:
                    resp.firing_alerts[job_id] = resp.firing_alerts.get(job_id, 0) + 1
        return resp

    async def ListAlerts(self, request, context):
        caller = await self._caller(context)
        resp = query_pb2.ListAlertsResponse()
        if self.alerts is None:
            return resp
        owners = self.core.job_owners() if not caller.admin else {}
        for job_id, view in self.alerts.alert_list(request.job_id or None, request.include_resolved,
                                                   request.limit or 200):
            # node-wide alerts (agent_down, idle GPUs without a job) are for admins
            if caller.admin or (job_id and caller.may_see(owners.get(job_id, ""))):
                resp.alerts.add(job_id=job_id, alert=view)
        return resp

    async def GetTrace(self, request, context):
        caller = await self._caller(context)
        found = self.core.job_trace(request.job_id)
        if found is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"job {request.job_id} is not running on this collector; a trace can only be "
                                "recorded while the collector holds the job's samples")
        lines, owner = found
        await self._check_job(context, caller, request.job_id, owner)
        for i in range(0, len(lines), TRACE_CHUNK_LINES):
            yield query_pb2.TraceChunk(lines=lines[i:i + TRACE_CHUNK_LINES])

    async def AskTraining(self, request, context):
        caller = await self._caller(context)
        unauthenticated = action_rights.unauthenticated(self.auth)
        if unauthenticated and not self.unauthenticated_actions:
            # before the job is looked up: an anonymous caller learns nothing of it either
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, action_rights.NOT_OPTED_IN)
        if request.kind not in KINDS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"unknown request {request.kind[:64]!r}; one of {', '.join(KINDS)}")
        view = self.core.live_job_view(request.job_id, 2)  # resample needs 2 points
        if view is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"job {request.job_id} is not running on this collector; only a running job's "
                                "processes can be asked")
        # the stacks and snapshots are the user's data: the job's owner and admins only
        await self._check_job(context, caller, request.job_id, view.job.user)
        why = "" if unauthenticated else action_rights.why_not_act(caller, view.job.user, request.job_id)
        if why:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
        if self.asks is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this collector does not ask training processes")
        chosen = targets(view, request.rank if request.HasField("rank") else None)
        if not chosen:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"job {request.job_id} has no live process" +
                                (f" of rank {request.rank}" if request.HasField("rank") else ""))
        asked_by = f"user {caller.user}" if caller.user else "user (no authentication)"
        resp = query_pb2.AskTrainingResponse()
        resp.answers.extend(await self.asks.ask(request.job_id, chosen, request.kind, asked_by, request.timeout_s))
        if request.kind == "dump_stacks":
            resp.stack_groups.extend(stack_groups(resp.answers))
        return resp

    async def ListHealth(self, request, context):
        caller = await self._caller(context)
        if not caller.admin:
            # its findings name every user's jobs, ranks and processes
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                "clusterwatch health is for the cluster's operators (users the collector's "
                                "--query-admin names, and root); your own jobs' health is in "
                                "`clusterwatch status JOBID`")
        if request.node:
            with self.core.lock:
                known = request.node in self.core.state.nodes
            if not known:  # an empty list would read as a node whose GPUs are all well
                await context.abort(grpc.StatusCode.NOT_FOUND,
                                    f"unknown node {request.node!r}: no agent of that name reports to this collector; "
                                    "`clusterwatch health` lists the nodes whose GPUs have findings")
        resp = query_pb2.ListHealthResponse()
        health = getattr(self.alerts, "health", None)
        if health is not None:
            with self.core.lock:  # ingest changes the health engine under it
                resp.gpus.extend(health.health_rows(request.node))
                resp.nodes.extend(health.node_rows(request.node))
        return resp
