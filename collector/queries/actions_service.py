"""The operators' view of what clusterwatch did on its own: the audit trail (`clusterwatch health --history`).

Beside the query service, on its ports, asking its authentication: an action names every user's jobs and
nodes, so only the collector's admins are answered, as for `clusterwatch health`.
"""
from __future__ import annotations

import grpc
from clusterwatch.v1 import actions_pb2, actions_pb2_grpc

from ..alerting.audit import ActionAudit
from ..health.offenders import FindingHistory
from .service import QueryServicer

#: The most rows one answer holds: a page of a terminal's history, not the whole table.
MAX_ROWS = 5000
DEFAULT_ROWS = 200
#: The GPUs, and the nodes, ranked in one answer.
RANKED = 20


class ActionsServicer(actions_pb2_grpc.ActionsServicer):
    """The audit trail, newest first, to admins.

    Args:
        query: the query service, whose authentication and admins this one shares.
        audit: the collector's audit trail; None: no actions are recorded, and none are listed.
        offenders: the findings kept for the repeat offenders, ranked in the answer; by default those of the
            store the trail is in (the collector's); None with no trail: no ranking.
    """

    def __init__(self, query: QueryServicer, audit: ActionAudit | None,
                 offenders: FindingHistory | None = None) -> None:
        self.query = query
        self.audit = audit
        # the ranking only reads the table: a view of the store's, without the escalations the collector's raises
        self.offenders = offenders if offenders is not None or audit is None else FindingHistory(audit.conn)

    async def ListActions(self, request, context):
        caller = await self.query._caller(context)
        if not caller.admin:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                "clusterwatch health --history is for the cluster's operators (users the collector's "
                                "--query-admin names, and root): its actions name every user's jobs")
        resp = actions_pb2.ListActionsResponse()
        if self.offenders is not None:  # on the loop's thread too, the one findings are kept on
            gpus, nodes = self.offenders.ranking(request.node, limit=RANKED)
            for held, ranked in ((resp.gpus, gpus), (resp.nodes, nodes)):
                for o in ranked:
                    held.add(node=o.node, gpu=o.gpu, findings=o.findings, drains=o.drains, jobs_hurt=o.jobs_hurt,
                             mtbf_s=o.mtbf_s, serial=o.serial, jobs_held=o.jobs_held)
        if self.audit is None:
            return resp
        # on the loop's thread, the one the trail is written on (rows() writes the lanes' outcomes first)
        for r in self.audit.rows(min(request.limit or DEFAULT_ROWS, MAX_ROWS), request.node):
            resp.actions.add(time=r.at, action=r.action, node=r.node, job_id=r.job_id, outcome=r.outcome,
                             detail=r.detail, why=r.why, rule=r.rule)
        return resp
