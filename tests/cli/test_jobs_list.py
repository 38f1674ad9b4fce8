"""`jobs` says what `status` says (issue 26): a job's GPU count where nobody gave one is the GPUs its processes
use, unknown ("-", null) rather than 0 where none was seen; an ended job's ALERTS are those it ended with, as its
web page's badge counts them; a list with only ended jobs says how to see them."""
from __future__ import annotations

import asyncio

from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.queries.service import QueryServicer
from clusterwatch.collector.state.core import CollectorCore
from clusterwatch.collector.state.store import Store, open_db
from clusterwatch.v1 import agent_pb2, query_pb2

from clusterwatch.json_view import jobs_document
from clusterwatch.model import GpuUse, ProcessSample
from clusterwatch.report import render_jobs
from clusterwatch.wire import processes_to_table

T0 = 1_800_000_000.0


def _core() -> CollectorCore:
    core = CollectorCore(CollectorConfig(), Store(open_db(":memory:")), clock=lambda: T0)
    core.hello(agent_pb2.Hello(node="n1", boot_id="b1", interval_s=1.0, send_interval_s=1.0,
                               gpus=[agent_pb2.GpuInfo(uuid=f"GPU-{n}", index=n, memory_total_bytes=1 << 30)
                                     for n in range(2)]))
    batch = agent_pb2.Batch(seq=1)
    processes_to_table([ProcessSample(T0, "n1", 10 + n, T0 - 50, user="alice", job_id="local-10", rank=n,
                                      gpus=(GpuUse(f"GPU-{n}", 1 << 20, 10.0),)) for n in range(2)]
                       + [ProcessSample(T0, "n1", 20, T0 - 50, user="alice", job_id="local-20")], batch.processes)
    for n in range(2):
        batch.gpus.add(time=T0, uuid=f"GPU-{n}", utilization=10.0, memory_used_bytes=1 << 20,
                       memory_total_bytes=1 << 30)
    assert core.batch("n1", "b1", batch) is True
    return core


class _Alerts:
    """Alerts as the live alerting lists them: (job id, AlertView), active first, then resolved."""

    def __init__(self, *alerts: tuple[str, query_pb2.AlertView]) -> None:
        self._alerts = alerts

    def alert_list(self, job_id, include_resolved, limit):
        return [(j, a) for j, a in self._alerts if include_resolved or a.state != "resolved"]


class _Context:
    def invocation_metadata(self):
        return ()


def _list(core, alerts=None, include_ended=True) -> query_pb2.ListJobsResponse:
    servicer = QueryServicer(core, alerts=alerts)
    return asyncio.run(servicer.ListJobs(query_pb2.ListJobsRequest(include_ended=include_ended), _Context()))


def test_a_job_without_an_allocation_counts_the_gpus_its_processes_use():
    resp = _list(_core())
    gpus = {j.job_id: j.gpus for j in resp.jobs}
    assert gpus == {"local-10": 2, "local-20": 0}
    doc = jobs_document(resp)
    assert {j["job_id"]: j["gpus"] for j in doc["jobs"]} == {"local-10": 2, "local-20": None}
    lines = render_jobs(list(resp.jobs), {}, T0).splitlines()
    columns = {x.split()[0]: x.split()[4] for x in lines[1:]}  # JOB USER STATE NODES GPUS
    assert columns == {"local-10": "2", "local-20": "-"}


def test_an_ended_job_counts_the_alerts_it_ended_with_not_those_that_cleared():
    core = _core()
    ended_firing = query_pb2.AlertView(rule="gpu_memory_leak", state="resolved", ended_while_firing=True)
    cleared = query_pb2.AlertView(rule="low_gpu_utilization", state="resolved")
    firing = query_pb2.AlertView(rule="stalled", state="firing")
    resp = _list(core, _Alerts(("local-10", firing), ("local-10", ended_firing), ("local-10", cleared),
                               ("local-20", cleared)))
    assert dict(resp.firing_alerts) == {"local-10": 2}


def test_a_list_of_ended_jobs_only_says_how_to_see_them():
    said = render_jobs([], {}, T0, include_ended=False)
    assert said == "no running jobs known to the collector; `clusterwatch jobs --all` lists those that ended too\n"
    assert render_jobs([], {}, T0, include_ended=True) == "no jobs known to the collector\n"
