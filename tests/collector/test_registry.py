"""The job registry against FakeJobMapper (and a scontrol that never answers): fields, closing, Slurm down."""
from __future__ import annotations

import asyncio
import sqlite3
import time

import pytest
from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.jobmap.fake import FakeJobMapper
from clusterwatch.collector.jobmap.registry import SETTLE_WINDOW_S, JobRegistry
from clusterwatch.collector.jobmap.scontrol import ScontrolMapper
from clusterwatch.collector.queries.views import job_view
from clusterwatch.collector.state.core import CollectorCore
from clusterwatch.collector.state.store import Store, open_db
from clusterwatch.v1 import query_pb2

from clusterwatch.model import GpuInfo, JobEvent
from clusterwatch.slurm.listpids import PidEntry
from clusterwatch.slurm.scontrol import JobRecord

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def record(job_id: int = 42, state: str = "RUNNING", **kw) -> JobRecord:
    base = dict(
        job_id=job_id, name="train-llm", user="alice", uid=1000, account="ml", partition="gpu", state=state,
        submit_time=int(T0 - 60), start_time=int(T0 - 30), end_time=int(T0 + 3600), time_limit_s=3600,
        nodes=("n1", "n2"), cpus=8, memory_bytes=16 << 30, gpus_by_node={"n1": (0,), "n2": (1,)},
        gpu_count_by_node={"n1": 1, "n2": 1}, num_tasks=2,
    )
    base.update(kw)
    return JobRecord(**base)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def core(clock: Clock) -> CollectorCore:
    return CollectorCore(CollectorConfig(), Store(open_db(":memory:")), clock=clock)


def hello(core: CollectorCore, node: str, clock: Clock) -> list[str]:
    gpus = [GpuInfo(f"GPU-{node}-{i}", i, "sim", 80 << 30) for i in range(2)]
    core.state.hello(node, "boot", "0", 1.0, "sim", 1 << 30, gpus, clock.now)
    return [g.uuid for g in gpus]


def summary(core: CollectorCore, job_id: str) -> query_pb2.JobView:
    core.flush()
    data = core.store.load_summary(job_id)
    assert data is not None, f"no summary stored for job {job_id}"
    view = query_pb2.JobView()
    view.ParseFromString(data)
    return view


def test_fields_come_from_slurm(core: CollectorCore, clock: Clock) -> None:
    uuids = hello(core, "n1", clock)
    mapper = FakeJobMapper([record()])
    registry = JobRegistry(core, mapper, clock=clock)
    assert asyncio.run(registry.refresh()) is True
    job = core.state.jobs["42"]
    assert (job.name, job.user, job.account, job.partition, job.state) == ("train-llm", "alice", "ml", "gpu",
                                                                          "RUNNING")
    assert (job.submit_time, job.start_time, job.time_limit_s) == (T0 - 60, T0 - 30, 3600)
    assert job.end_time == 0  # Slurm's EndTime of a running job is only its expected end
    assert job.nodes == ["n1", "n2"]
    assert (job.cpus, job.memory_bytes, job.gpus, job.ranks_expected) == (8, 16 << 30, 2, 2)
    assert job.source == "slurm"
    # n1's agent said which UUID has index 0; n2 has no agent, so no UUID is made up for it.
    assert job.gpus_by_node == {"n1": [uuids[0]]}
    assert ("list_jobs", ()) in mapper.calls
    view = job_view(core.state, job, clock.now)
    assert [g.uuid for g in view.gpus] == [uuids[0]]
    assert view.gpus[0].processes == 0  # allocated, no process on it: status says so


def test_prolog_uuids_win_over_slurm_indexes(core: CollectorCore, clock: Clock) -> None:
    hello(core, "n1", clock)
    core.state.job_event("n1", JobEvent("start", "42", T0, gpu_uuids=("GPU-from-prolog",)))
    asyncio.run(JobRegistry(core, FakeJobMapper([record()]), clock=clock).refresh())
    assert core.state.jobs["42"].gpus_by_node["n1"] == ["GPU-from-prolog"]


@pytest.mark.parametrize(("state", "exit_code", "signal", "expected_exit"), [
    ("COMPLETED", 0, None, 0),
    ("FAILED", 3, None, 3),
    ("CANCELLED", 0, 15, 143),
])
def test_job_closed_when_slurm_says_it_ended(core: CollectorCore, clock: Clock, state: str, exit_code: int,
                                             signal: int | None, expected_exit: int) -> None:
    mapper = FakeJobMapper([record()])
    registry = JobRegistry(core, mapper, clock=clock)
    asyncio.run(registry.refresh())
    assert "42" in core.state.jobs
    # Gone from squeue's running list, still known to show_job with its final state.
    mapper.jobs[42] = record(state=state, end_time=int(T0 + 5), exit_code=exit_code, exit_signal=signal)
    clock.now += 5
    asyncio.run(registry.refresh())
    assert "42" not in core.state.jobs  # out of memory and /metrics
    view = summary(core, "42")
    assert view.job.state == state
    assert view.job.exit_code == expected_exit
    assert view.job.end_time == T0 + 5
    # Slurm still listing it (COMPLETING, say) does not bring a closed job back.
    mapper.jobs[42] = record(state="COMPLETING")
    asyncio.run(registry.refresh())
    assert "42" not in core.state.jobs


def test_agents_get_a_grace_period_to_deliver_the_epilog(core: CollectorCore, clock: Clock) -> None:
    hello(core, "n1", clock)
    core.state.job_event("n1", JobEvent("start", "42", T0))  # the prolog announced it
    mapper = FakeJobMapper([record(state="COMPLETED", exit_code=0)])
    registry = JobRegistry(core, mapper, close_grace_s=10.0, clock=clock)
    asyncio.run(registry.refresh())
    assert core.state.jobs["42"].state == "COMPLETED"  # n1's agent is up: its end event may be on the way
    clock.now += 11
    core.state.nodes["n1"].last_seen = clock.now
    asyncio.run(registry.refresh())
    assert "42" not in core.state.jobs
    assert summary(core, "42").job.state == "COMPLETED"


def close_by_epilogs(core: CollectorCore, clock: Clock, exit_code: int) -> None:
    """Job 42 ends the way its epilogs say: the end events of all its nodes close it, COMPLETED or FAILED."""
    core.state.job_event("n1", JobEvent("start", "42", T0))
    for node in list(core.state.jobs["42"].nodes):
        job = core.state.job_event(node, JobEvent("end", "42", clock.now, exit_code=exit_code))
    assert job.ended
    core.close_job(job)


@pytest.mark.parametrize(("final", "exit_code", "signal", "expected_exit"), [
    ("CANCELLED", 0, 15, 143),
    ("TIMEOUT", 0, 15, 143),
    ("OUT_OF_MEMORY", 0, 9, 137),
])
def test_a_job_its_epilogs_closed_takes_slurms_final_state(core: CollectorCore, clock: Clock, final: str,
                                                          exit_code: int, signal: int, expected_exit: int) -> None:
    hello(core, "n1", clock)
    mapper = FakeJobMapper([record()])
    registry = JobRegistry(core, mapper, clock=clock)
    asyncio.run(registry.refresh())
    clock.now += 5
    close_by_epilogs(core, clock, exit_code=1)
    assert summary(core, "42").job.state == "FAILED"  # all the epilog knows
    mapper.jobs[42] = record(state="COMPLETING")
    asyncio.run(registry.refresh())
    assert summary(core, "42").job.state == "FAILED"  # Slurm has no final word yet
    assert "42" not in core.state.jobs
    mapper.jobs[42] = record(state=final, end_time=int(T0 + 4), exit_code=exit_code, exit_signal=signal)
    clock.now += 5
    asyncio.run(registry.refresh())
    view = summary(core, "42")
    assert (view.job.state, view.job.exit_code, view.job.end_time) == (final, expected_exit, T0 + 4)
    stored = {j.job_id: j for j in core.store.load_jobs()}["42"]
    assert (stored.state, stored.exit_code, stored.end_time) == (final, expected_exit, T0 + 4)
    assert "42" not in core.state.jobs  # amended in the store, not brought back
    calls = len(mapper.calls)
    asyncio.run(registry.refresh())
    assert ("show_job", (42,)) not in mapper.calls[calls:]  # settled: Slurm is not asked again


def test_a_restarted_collector_still_takes_slurms_final_state(core: CollectorCore, clock: Clock) -> None:
    hello(core, "n1", clock)
    mapper = FakeJobMapper([record()])
    asyncio.run(JobRegistry(core, mapper, clock=clock).refresh())
    close_by_epilogs(core, clock, exit_code=0)
    core.flush()
    # The collector restarts: a new core and registry on the same store. Slurm still lists the job as
    # COMPLETING, which must not bring it back, then gives its final state.
    restarted = CollectorCore(CollectorConfig(), core.store, clock=clock)
    registry = JobRegistry(restarted, mapper, clock=clock)
    mapper.jobs[42] = record(state="COMPLETING")
    asyncio.run(registry.refresh())
    assert "42" not in restarted.state.jobs
    mapper.jobs[42] = record(state="TIMEOUT", end_time=int(clock.now), exit_code=0, exit_signal=15)
    asyncio.run(registry.refresh())
    assert (summary(restarted, "42").job.state, summary(restarted, "42").job.exit_code) == ("TIMEOUT", 143)


def test_an_epilog_closed_job_slurm_forgot_or_never_settles_keeps_the_epilogs_word(core: CollectorCore,
                                                                                   clock: Clock) -> None:
    hello(core, "n1", clock)
    mapper = FakeJobMapper([])
    registry = JobRegistry(core, mapper, clock=clock)
    close_by_epilogs(core, clock, exit_code=0)
    asyncio.run(registry.refresh())  # Slurm does not know job 42 (MinJobAge passed): nothing to wait for
    assert summary(core, "42").job.state == "COMPLETED"
    calls = len(mapper.calls)
    asyncio.run(registry.refresh())
    assert ("show_job", (42,)) not in mapper.calls[calls:]
    # A job Slurm lists as COMPLETING for longer than the window is given up on too.
    mapper.jobs[43] = record(job_id=43, state="COMPLETING")
    core.state.job_event("n1", JobEvent("start", "43", T0))
    core.close_job(core.state.job_event("n1", JobEvent("end", "43", clock.now, exit_code=0)))
    asyncio.run(registry.refresh())
    clock.now += SETTLE_WINDOW_S + 1
    asyncio.run(registry.refresh())
    calls = len(mapper.calls)
    asyncio.run(registry.refresh())
    assert ("show_job", (43,)) not in mapper.calls[calls:]
    assert summary(core, "43").job.state == "COMPLETED"


def test_slurmctld_down_sets_the_note_and_backs_off(core: CollectorCore, clock: Clock) -> None:
    core.state.job_event("n1", JobEvent("start", "42", T0, user="alice"))
    mapper = FakeJobMapper([record()])
    mapper.unavailable = "slurmctld did not answer within 5 s; is it running?"
    registry = JobRegistry(core, mapper, interval_s=2.0, max_backoff_s=30.0, clock=clock)
    delays = []
    for _ in range(5):
        assert asyncio.run(registry.refresh()) is False
        delays.append(registry.next_delay())
        clock.now += 60
    assert delays == [4.0, 8.0, 16.0, 30.0, 30.0]
    note = core.state.jobs["42"].note
    since = time.strftime("%H:%M", time.localtime(T0))
    assert note == f"slurmctld unreachable since {since}: showing what the agents reported"
    assert job_view(core.state, core.state.jobs["42"], clock.now).job.note == note
    mapper.unavailable = None
    assert asyncio.run(registry.refresh()) is True
    assert core.state.jobs["42"].note == ""
    assert registry.next_delay() == 2.0


@pytest.mark.serial  # times the refresh against scontrol's timeout (under 2 s) and counts the loop's 50 ms ticks
def test_a_scontrol_that_hangs_never_blocks_the_loop(core: CollectorCore, clock: Clock, tmp_path) -> None:
    hang = tmp_path / "scontrol"
    for client in (hang, tmp_path / "squeue"):  # the text format asks squeue for the owners first
        client.write_text("#!/bin/sh\nexec sleep 30\n")
        client.chmod(0o755)
    core.state.job_event("n1", JobEvent("start", "7", T0))
    registry = JobRegistry(core, ScontrolMapper(scontrol=str(hang), timeout_s=0.5, retries=0, use_json=False),
                           clock=clock)

    async def main() -> tuple[bool, int, float]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        task = asyncio.ensure_future(ticker())
        start = time.monotonic()
        answered = await registry.refresh()
        took = time.monotonic() - start
        task.cancel()
        return answered, ticks, took

    answered, ticks, took = asyncio.run(main())
    assert answered is False
    assert took < 2.0
    assert ticks >= 5  # the event loop kept running while scontrol hung
    assert core.state.jobs["7"].note.startswith("slurmctld unreachable since")


def test_nodes_without_an_agent_are_filled_in_by_listpids(core: CollectorCore, clock: Clock) -> None:
    hello(core, "n1", clock)
    pids = {(42, "n2"): [PidEntry(4242, 42, "0", 0, 1), PidEntry(4243, 42, "0", None, None)],
            (42, "n1"): [PidEntry(1111, 42, "0", 0, 0)]}
    mapper = FakeJobMapper([record()], pids)
    registry = JobRegistry(core, mapper, fill_in=True, clock=clock)
    asyncio.run(registry.refresh())
    job = core.state.jobs["42"]
    assert ("listpids", (42, "n2")) in mapper.calls
    assert ("listpids", (42, "n1")) not in mapper.calls  # n1's agent reports its processes itself
    assert job.listed_pids == {"n2": {4242: 1, 4243: None}}
    view = job_view(core.state, job, clock.now)
    listed = [(p.node, p.pid, p.rank if p.HasField("rank") else None, p.mapped_by) for p in view.processes]
    assert listed == [("n2", 4242, 1, "listpids"), ("n2", 4243, None, "listpids")]
    assert not view.processes[0].HasField("rss_bytes")  # no agent there: no figures


def test_listpids_failure_is_counted_not_fatal(core: CollectorCore, clock: Clock) -> None:
    class Failing(FakeJobMapper):
        async def listpids(self, job_id: int, node: str):
            from clusterwatch.collector.jobmap.base import SlurmUnavailable

            raise SlurmUnavailable(f"ssh {node}: no connection")

    registry = JobRegistry(core, Failing([record()]), fill_in=True, clock=clock)
    assert asyncio.run(registry.refresh()) is True
    assert registry.listpids_errors == 2
    assert core.state.jobs["42"].listed_pids == {}


def test_start_and_stop_the_task(core: CollectorCore, clock: Clock) -> None:
    mapper = FakeJobMapper([record(job_id=5)])

    async def main() -> None:
        registry = JobRegistry(core, mapper, interval_s=0.05, clock=clock)
        registry.start()
        await asyncio.sleep(0.3)
        await registry.stop()

    asyncio.run(main())
    assert sum(1 for c in mapper.calls if c[0] == "list_jobs") >= 3
    assert list(core.state.jobs) == ["5"]


def test_a_store_that_refuses_writes_never_breaks_a_registry_pass(core: CollectorCore, clock: Clock) -> None:
    """A full or locked store: the job rows the registry changes wait for the flush, the pass goes on."""
    core.store.conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON jobs "
                            "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END")
    registry = JobRegistry(core, FakeJobMapper([record()]), clock=clock)
    assert asyncio.run(registry.refresh()) is True  # raised OperationalError when it wrote at once
    assert core.state.jobs["42"].user == "alice"
    with pytest.raises(sqlite3.Error):
        core.flush()  # the row is still to be written
    core.store.conn.execute("DROP TRIGGER refuse")
    core.flush()
    assert [j.job_id for j in core.store.load_jobs(include_ended=True)] == ["42"]
