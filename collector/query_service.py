"""The users' side of the collector: read-only answers for `status`, `jobs`, `alerts` and `record`."""
from __future__ import annotations

import grpc
from clusterwatch.v1 import query_pb2, query_pb2_grpc

from .core import CollectorCore
from .query_auth import AuthError, Caller, NoAuth
from .trace import job_trace_lines
from .views import DEFAULT_TREND_POINTS, job_info, job_view


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
