"""An agent's batch split among the deployment's collectors, and the buffer bound its streams share."""
from __future__ import annotations

from clusterwatch.agent.shard_streams import BatchSplitter
from clusterwatch.agent.stream import BatchBuffer, BufferBudget
from clusterwatch.v1 import agent_pb2

from clusterwatch.model import GpuUse, ProcessSample
from clusterwatch.shards import Collectors, pick

LIST = ("c1:1", "c2:2", "c3:3")
T = 1_800_000_000.0


def node_on(collector: str) -> str:
    return next(f"n{i}" for i in range(1000) if pick(f"n{i}", LIST) == collector)


def job_on(collector: str, start: int = 1000) -> str:
    return next(str(j) for j in range(start, start + 1000) if pick(str(j), LIST) == collector)


def sample(pid: int, job: str = "", gpu: str | None = None) -> ProcessSample:
    return ProcessSample(T, "n", pid, T - 10, job_id=job, gpus=(GpuUse(gpu, 1 << 30, 50.0),) if gpu else ())


def gpu(uuid: str) -> agent_pb2.GpuSample:
    return agent_pb2.GpuSample(uuid=uuid, time=T)


def test_a_jobs_processes_reports_provenance_and_events_go_to_its_collector_the_nodes_own_to_the_nodes():
    node = node_on("c1:1")
    job_a, job_b = job_on("c2:2"), job_on("c3:3")
    split = BatchSplitter(Collectors(LIST), node)
    batch = agent_pb2.Batch(sent_at=T)
    batch.gpus.extend([gpu("GPU-0"), gpu("GPU-1"), gpu("GPU-2")])
    batch.job_events.add(kind=agent_pb2.JobEvent.START, job_id=job_b, gpu_uuids=["GPU-2"])
    batch.training.add(pid=10, start_time=T - 10)
    batch.provenance.add(pid=20, start_time=T - 10, json="{}")
    batch.health_events.add()
    samples = [sample(10, job_a, "GPU-0"), sample(11, job_a), sample(20, job_b), sample(30)]
    parts = split.split(batch, samples)
    assert set(parts) == set(LIST)
    pids = {c: [s.pid for s in rows] for c, (_, rows) in parts.items()}
    assert pids == {"c1:1": [30], "c2:2": [10, 11], "c3:3": [20]}
    node_part, a_part, b_part = parts["c1:1"][0], parts["c2:2"][0], parts["c3:3"][0]
    assert [g.uuid for g in node_part.gpus] == ["GPU-0", "GPU-1", "GPU-2"]  # every reading: the node's own series
    assert [g.uuid for g in a_part.gpus] == ["GPU-0"]  # the GPU its process uses
    assert [g.uuid for g in b_part.gpus] == ["GPU-2"]  # the GPU its prolog allocated
    assert [e.job_id for e in b_part.job_events] == [job_b] and not node_part.job_events
    assert len(a_part.training) == 1 and len(b_part.provenance) == 1
    assert len(node_part.health_events) == 1 and not a_part.health_events


def test_a_collector_whose_processes_are_gone_gets_one_empty_batch_then_none():
    node = node_on("c1:1")
    job = job_on("c2:2")
    split = BatchSplitter(Collectors(LIST), node)
    assert set(split.split(agent_pb2.Batch(sent_at=T), [sample(10, job)])) == {"c1:1", "c2:2"}
    closing = split.split(agent_pb2.Batch(sent_at=T + 5), [])
    assert set(closing) == {"c1:1", "c2:2"} and closing["c2:2"][1] == []
    assert set(split.split(agent_pb2.Batch(sent_at=T + 10), [])) == {"c1:1"}


def test_a_running_job_stays_on_the_list_it_started_on():
    old = ("c1:1", "c2:2")
    job = next(str(j) for j in range(100, 2000) if pick(str(j), old) == "c1:1" and pick(str(j), LIST) == "c3:3")
    moved = Collectors(LIST, old, int(job) + 1)
    node = node_on("c2:2")
    assert set(BatchSplitter(moved, node).split(agent_pb2.Batch(), [sample(1, job)])) == {"c2:2", "c1:1"}
    assert set(BatchSplitter(Collectors(LIST), node).split(agent_pb2.Batch(), [sample(1, job)])) == {"c2:2", "c3:3"}


def test_one_collector_gets_the_batch_itself():
    batch = agent_pb2.Batch(sent_at=T)
    rows = [sample(1, "7")]
    parts = BatchSplitter(Collectors(("only:1",)), "n").split(batch, rows)
    assert parts == {"only:1": (batch, rows)}


def test_the_streams_share_one_bound_and_a_healthy_stream_never_drops_for_another():
    budget = BufferBudget(100)
    down, healthy = BatchBuffer(100, budget), BatchBuffer(100, budget)
    dropped = 0
    for seq in range(1, 12):  # the down collector's stream fills the budget: its oldest go
        dropped += down.add(seq, agent_pb2.Batch(), 10)
    assert down.samples <= 100 and dropped == 10
    healthy.add(1, agent_pb2.Batch(), 10)  # in flight beside it: kept
    assert healthy.add(2, agent_pb2.Batch(), 10) == 0 and healthy.samples == 20
    assert healthy.ack(1) == 10 and healthy.ack(2) == 10
    assert down.add(12, agent_pb2.Batch(), 10) == 10  # the bound again, on the stream that holds it
    assert budget.samples == down.samples + healthy.samples <= 100


def test_batches_without_a_process_are_bounded_too():
    """A node stream's batches carry GPU readings and no process: each weighs 1 against the bound."""
    buffer = BatchBuffer(10)
    for seq in range(1, 26):
        buffer.add(seq, agent_pb2.Batch(), 0)
    assert len(buffer) == 10 and buffer.first_seq() == 16
    assert buffer.ack(16) == 0 and len(buffer) == 9 and buffer.weight == 9


def test_the_nodes_own_counters_go_to_the_nodes_collector_only():
    node = node_on("c1:1")
    split = BatchSplitter(Collectors(LIST), node)
    batch = agent_pb2.Batch(sent_at=T)
    batch.counters.job_output_files, batch.counters.job_output_refused = 2, 1
    parts = split.split(batch, [sample(10, job_on("c2:2"))])
    node_part, job_part = parts["c1:1"][0], parts["c2:2"][0]
    assert node_part.counters.job_output_files == 2 and node_part.counters.job_output_refused == 1
    assert not job_part.counters.HasField("job_output_files")
