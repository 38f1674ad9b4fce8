"""A job's owner is Slurm's word, or the user its node's agent sees running it; never a field a client sets.

Without a token anyone who reaches the collector's port can open an ingest stream and send job
events and samples naming any job: a prolog event's `user` must not re-own a job (and so let its
sender read it). Against FakeJobMapper here, and against the real two-node Slurm below.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.jobmap.fake import FakeJobMapper
from clusterwatch.collector.jobmap.registry import JobRegistry
from clusterwatch.collector.state.core import CollectorCore
from clusterwatch.collector.state.store import Store, open_db
from clusterwatch.v1 import agent_pb2, agent_pb2_grpc

from clusterwatch.model import JobEvent, ProcessSample
from clusterwatch.slurm.scontrol import JobRecord
from clusterwatch.wire import job_event_to_proto, processes_to_table
from tests.services.slurm import SlurmCluster, slurm_cluster, slurm_hooks  # noqa: F401  (fixtures)
from tests.support.helpers import AGENT_METADATA, Collector, cli, wait_for

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def record(job_id: int = 42, user: str = "alice") -> JobRecord:
    return JobRecord(job_id=job_id, name="train", user=user, uid=1000, account="ml", partition="gpu",
                     state="RUNNING", submit_time=int(T0 - 60), start_time=int(T0 - 30), end_time=int(T0 + 3600),
                     time_limit_s=3600, nodes=("n1",), cpus=8, memory_bytes=16 << 30, gpus_by_node={},
                     gpu_count_by_node={}, num_tasks=1)


def hostile_batch(seq: int, job_id: str, user: str = "mallory", t: float = T0) -> agent_pb2.Batch:
    """What any client can send: a prolog's start naming itself the owner, and a sample of 'its' process."""
    b = agent_pb2.Batch(seq=seq)
    job_event_to_proto(JobEvent("start", job_id, t, uid=6666, user=user), b.job_events.add())
    processes_to_table([ProcessSample(t, "n1", 4000 + seq, T0 - 10, uid=6666, user=user, command="python",
                                      job_id=job_id)], b.processes)
    return b


def agent_batch(seq: int, job_id: str, user: str, t: float = T0) -> agent_pb2.Batch:
    b = agent_pb2.Batch(seq=seq)
    processes_to_table([ProcessSample(t, "n1", 100, T0 - 20, uid=1000, user=user, command="python",
                                      job_id=job_id)], b.processes)
    return b


def make_core(slurm: bool, authenticated: bool = True) -> CollectorCore:
    core = CollectorCore(CollectorConfig(slurm=slurm), Store(open_db(":memory:")), clock=Clock())
    if authenticated:  # the agent's stream proved who sent it (token, mutual TLS, root's munge credential)
        core.hello(agent_pb2.Hello(node="n1", boot_id="b1", interval_s=1.0), authenticated=True)
    else:
        core.hello(agent_pb2.Hello(node="n1", boot_id="b1", interval_s=1.0))
    return core


def samples_only(seq: int, job_id: str, user: str, node: str = "n1", pid: int = 100) -> agent_pb2.Batch:
    """A batch of one process sample and no job event: the first to name the job."""
    b = agent_pb2.Batch(seq=seq)
    processes_to_table([ProcessSample(T0, node, pid, T0 - 20, uid=1000, user=user, command="python",
                                      job_id=job_id)], b.processes)
    return b


def test_a_sample_first_to_name_a_slurm_job_id_gives_it_no_owner() -> None:
    # with --slurm the job is nobody's until Slurm answers, even when a sample (not a prolog) names it first
    core = make_core(slurm=True, authenticated=False)
    core.batch("n1", "b1", samples_only(1, "4242", "mallory"))
    assert core.state.jobs["4242"].user == ""
    core.flush()
    assert {j.job_id: j.user for j in core.store.load_jobs()}["4242"] == ""


def test_an_unauthenticated_stream_owns_no_job() -> None:
    # its samples are claims: the job is shown to admins only, whoever sent them first
    core = make_core(slurm=False, authenticated=False)
    core.batch("n1", "b1", samples_only(1, "77", "mallory"))
    assert core.state.jobs["77"].user == ""
    core.batch("n1", "b1", samples_only(2, "local-5", "mallory", pid=101))
    assert core.state.jobs["local-5"].user == ""


def test_agents_that_disagree_on_a_jobs_user_leave_it_without_an_owner() -> None:
    core = make_core(slurm=False)
    core.hello(agent_pb2.Hello(node="n2", boot_id="b2", interval_s=1.0), authenticated=True)
    core.batch("n1", "b1", samples_only(1, "77", "alice"))
    assert core.state.jobs["77"].user == "alice"
    core.batch("n2", "b2", samples_only(1, "77", "mallory", node="n2"))
    assert core.state.jobs["77"].user == ""  # not the first one's: admins only
    core.batch("n1", "b1", samples_only(2, "77", "alice", pid=102))
    assert core.state.jobs["77"].user == ""  # and it stays so


def test_a_prolog_event_never_re_owns_a_job_slurm_knows() -> None:
    core = make_core(slurm=True)
    registry = JobRegistry(core, FakeJobMapper([record()]), clock=core.clock)
    assert asyncio.run(registry.refresh()) is True
    assert core.state.jobs["42"].user == "alice"
    core.batch("n1", "b1", hostile_batch(1, "42"))
    assert core.state.jobs["42"].user == "alice"
    core.flush()
    assert {j.job_id: j.user for j in core.store.load_jobs()}["42"] == "alice"


def test_before_slurm_answers_a_slurm_job_has_no_owner_then_slurms() -> None:
    core = make_core(slurm=True)
    core.batch("n1", "b1", hostile_batch(1, "42"))  # the hostile client is first
    assert core.state.jobs["42"].user == ""  # nobody's until Slurm says: only admins see it
    asyncio.run(JobRegistry(core, FakeJobMapper([record()]), clock=core.clock).refresh())
    assert core.state.jobs["42"].user == "alice"
    core.batch("n1", "b1", hostile_batch(2, "42"))
    assert core.state.jobs["42"].user == "alice"


def test_without_slurm_the_owner_is_who_runs_the_processes_not_the_events_user() -> None:
    core = make_core(slurm=False)
    prolog = agent_pb2.Batch(seq=1)
    job_event_to_proto(JobEvent("start", "77", T0, uid=6666, user="mallory"), prolog.job_events.add())
    core.batch("n1", "b1", prolog)
    assert core.state.jobs["77"].user == ""  # a prolog alone names no owner
    core.batch("n1", "b1", agent_batch(2, "77", "alice"))
    assert core.state.jobs["77"].user == "alice"
    # later claims of a stream that proved nothing change nothing, by event or by sample
    core.hello(agent_pb2.Hello(node="n9", boot_id="b9", interval_s=1.0))
    core.batch("n9", "b9", hostile_batch(3, "77"))
    assert core.state.jobs["77"].user == "alice"


# -- the real two-node Slurm -------------------------------------------------------------------------


def _stream_and_wait_for_ack(address: str, batch: agent_pb2.Batch) -> list[int]:
    channel = grpc.insecure_channel(address)
    try:
        stub = agent_pb2_grpc.IngestStub(channel)

        def messages():
            yield agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="n1", boot_id="hostile-1", interval_s=1.0))
            yield agent_pb2.AgentMessage(batch=batch)
            time.sleep(2)  # the ack comes after the collector's next flush

        # a stream of the agents' token: even an authenticated agent's samples never re-own a Slurm job
        return [m.ack.seq for m in stub.Stream(messages(), metadata=AGENT_METADATA, timeout=30)
                if m.WhichOneof("body") == "ack"]
    finally:
        channel.close()


@pytest.mark.slurm
def test_a_hostile_prolog_event_leaves_a_real_slurm_job_its_owners(slurm_cluster: SlurmCluster,  # noqa: F811
                                                                  tmp_path: Path, monkeypatch) -> None:
    for name in list(os.environ):
        if name.startswith("CLUSTERWATCH_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    # submitted by root (a job of an unprivileged user cannot start here: slurmd's spool is root's alone)
    out = slurm_cluster.run(["sbatch", "--parsable", "--chdir=/tmp",
                             "--output=/dev/null", "--wrap", "sleep 120"])
    job_id = out.stdout.strip().split(";")[0]
    slurm_cluster.wait_job_state(int(job_id), ["RUNNING"])
    # The registry's first pass (at start) takes the job from Slurm; the next is far off, so what the
    # owner reads after the hostile batch is what the batch did, not a pass that repaired it.
    collector = None
    try:
        collector = Collector(tmp_path, "--slurm", "--slurm-refresh", "60", "--query-auth", "none")

        def owner() -> str:
            r = cli("status", job_id, "--json", "--collector", collector.address)
            return json.loads(r.stdout)["job"]["user"] if r.returncode == 0 else ""

        wait_for(lambda: owner() == "root", timeout=30, what="the job as Slurm's registry gives it")
        acks = _stream_and_wait_for_ack(collector.address, hostile_batch(1, job_id, t=time.time()))
        assert acks == [1]  # taken, and applied
        assert owner() == "root"
    finally:
        subprocess.run(["scancel", job_id], env=slurm_cluster.env, timeout=30, check=False)
        if collector is not None:
            collector.stop()
