"""The whole job, as jobstats shows it (issue 17, item 11): CPU time and the job's GPU figures accumulated
from the first sample to the last (not the history held), the GPU table of an ended job frozen at its last
readings while its processes were on it, and the report's CPU efficiency, host memory against the
allocation, QOS and cluster, and notes. A real CollectorCore fed numbered batches; the report rendered from
its views."""
from __future__ import annotations

from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.queries.views import job_view
from clusterwatch.collector.state.core import CollectorCore
from clusterwatch.collector.state.store import Store, open_db
from clusterwatch.v1 import agent_pb2, query_pb2

from clusterwatch.model import GpuUse, ProcessSample
from clusterwatch.report import render
from clusterwatch.wire import processes_to_table

T0 = 1_800_000_000.0
GIB = 1 << 30


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def _core(history_points: int = 720) -> tuple[CollectorCore, Clock]:
    clock = Clock()
    core = CollectorCore(CollectorConfig(), Store(open_db(":memory:")), clock=clock)
    core.state.history_points = history_points
    core.hello(agent_pb2.Hello(node="n1", boot_id="b1", interval_s=1.0, send_interval_s=1.0,
                               gpus=[agent_pb2.GpuInfo(uuid="GPU-a", index=0, memory_total_bytes=80 * GIB)]))
    return core, clock


def _send(core: CollectorCore, seq: int, t: float, procs: list[ProcessSample], util: float, mem: int) -> None:
    b = agent_pb2.Batch(seq=seq)
    processes_to_table(procs, b.processes)
    g = b.gpus.add(time=t, uuid="GPU-a", utilization=util, memory_used_bytes=mem, memory_total_bytes=80 * GIB,
                   power_watts=300.0 if util else 60.0)
    assert g.uuid == "GPU-a"
    assert core.batch("n1", "b1", b) is True


def _rank(t: float, cpu: float, gmem: int) -> ProcessSample:
    return ProcessSample(t, "n1", 11, T0 - 100, user="alice", job_id="a-1", rank=0, cpu_percent=cpu,
                         rss_bytes=2 * GIB, gpus=(GpuUse("GPU-a", gmem, 40.0),))


def test_cpu_time_and_gpu_totals_cover_every_sample_and_an_ended_job_keeps_its_last_live_readings():
    core, clock = _core(history_points=10)  # the history holds 10 points; the totals see all 300
    seq = 0
    for _ in range(300):
        seq += 1
        _send(core, seq, clock.now, [_rank(clock.now, 150.0, 20 * GIB)], util=60.0, mem=21 * GIB)
        clock.now += 1.0
    # the rank leaves; its GPU idles on, then a later reading with someone else's memory on it
    for i in range(20):
        seq += 1
        _send(core, seq, clock.now, [], util=0.0, mem=30 * GIB if i > 10 else 0)
        clock.now += 1.0
    job = core.state.jobs["a-1"]
    (series,) = core.state.job_processes(job)
    assert len(series.history) <= 10
    assert abs(series.cpu_seconds - 1.5 * 299) < 1.0  # 299 gaps of 1 s at 150 %
    job.state, job.end_time = "COMPLETED", clock.now
    view = job_view(core.state, job, clock.now)
    (p,) = view.processes
    assert abs(p.cpu_seconds - 1.5 * 299) < 1.0 and p.first_seen == T0
    (g,) = view.gpus
    assert abs(g.busy_seconds / g.covered_seconds - 0.6) < 1e-6 and abs(g.covered_seconds - 299) < 1e-6
    # frozen at the last reading while the rank was on it, not the idle (or someone else's) one after
    assert g.utilization == 60.0 and g.memory_used_bytes == 21 * GIB and g.power_watts == 300.0
    assert g.memory_peak_bytes == 21 * GIB  # the job's peak, not the GPU's 30 GiB after it
    # the report: whole-job GPU utilisation; CPU without Slurm's core count says what is known
    view.job.start_time = T0
    text = render(view, now=clock.now, width=None)
    assert "GPU utilisation" in text and "60%" in text.split("GPU utilisation", 1)[1].splitlines()[0]
    cpu = next(x for x in text.splitlines() if x.strip().startswith("CPU ") and "Overall" not in x)
    assert "n/a" not in cpu and "cores busy on average" in cpu and "allocated cores unknown" in cpu, cpu
    assert "1.4 cores" in cpu or "1.5 cores" in cpu, cpu
    host = next(x for x in text.splitlines() if x.strip().startswith("Host memory"))
    assert "allocation unknown" in host and "of node RAM" not in host, host
    # the Nodes table too: the job's 60 %, not the idle readings after it that fill the history held
    node_row = next(x for x in text.split("\nNodes\n", 1)[1].splitlines() if x.strip().startswith("n1 "))
    assert " 60% " in node_row, node_row


def _view(**job) -> query_pb2.JobView:
    info = dict(job_id="77", user="alice", state="RUNNING", start_time=T0, nodes=["n1"], cpus=32,
                memory_bytes=64 * GIB, qos="high", cluster="della", source="slurm")
    info.update(job)
    v = query_pb2.JobView(job=query_pb2.JobInfo(**info), now=T0 + 3600)
    v.nodes.add(node="n1", agent_up=True, memory_total_bytes=512 * GIB)
    return v


def test_the_report_shows_cpu_efficiency_host_memory_of_the_allocation_qos_cluster_and_notes():
    v = _view()
    live = v.processes.add(node="n1", pid=11, rank=0, alive=True, cpu_percent=400.0, rss_bytes=8 * GIB,
                           rss_peak_bytes=9 * GIB, cpu_seconds=4 * 3600.0, step=149, steps_per_s=0.0,
                           stalled_since=T0 + 3000)
    assert live.rank == 0
    v.processes.add(node="n1", pid=12, rank=1, alive=False, cpu_percent=0.0, rss_bytes=GIB, cpu_seconds=600.0)
    text = render(v, now=T0 + 3600, width=None)
    assert "QOS: high" in text and "Cluster: della" in text
    eff = next(x for x in text.splitlines() if "CPU efficiency" in x)
    assert "13%" in eff and "32 cores" in eff, eff  # (4 h + 10 min) / (1 h × 32)
    host = next(x for x in text.splitlines() if x.strip().startswith("Host memory"))
    assert "8.0 GiB of 64.0 GiB allocated" in host and "node RAM" not in host, host
    notes = " ".join(text.split("\nNotes\n", 1)[1].split())
    assert "CPU efficiency is 13%" in notes and "--cpus-per-task" in notes
    assert "The step of rank 0 on n1 has not moved since" in notes and "py-spy dump --pid 11" in notes
    assert "rank 1 on n1 has exited while the job runs" in notes


def test_an_ended_job_reads_its_host_memory_at_peak_of_the_allocation():
    v = _view(state="COMPLETED", end_time=T0 + 3600)
    v.processes.add(node="n1", pid=11, rank=0, alive=False, rss_bytes=GIB, rss_peak_bytes=40 * GIB,
                    cpu_seconds=30 * 3600.0)
    text = render(v, now=T0 + 4000, width=None)
    host = next(x for x in text.splitlines() if x.strip().startswith("Host memory"))
    assert "40.0 GiB at peak of 64.0 GiB allocated" in host, host
    eff = next(x for x in text.splitlines() if "CPU efficiency" in x)
    assert "94%" in eff, eff


def test_the_totals_of_a_running_job_survive_a_collector_restart(tmp_path):
    db = tmp_path / "cw.db"

    def start(clock: Clock) -> CollectorCore:
        core = CollectorCore(CollectorConfig(), Store(open_db(str(db))), clock=clock)
        core.hello(agent_pb2.Hello(node="n1", boot_id="b1", interval_s=1.0, send_interval_s=1.0,
                                   gpus=[agent_pb2.GpuInfo(uuid="GPU-a", index=0, memory_total_bytes=80 * GIB)]))
        return core

    clock = Clock()
    core = start(clock)
    for seq in range(1, 101):
        _send(core, seq, clock.now, [_rank(clock.now, 150.0, 20 * GIB)], util=60.0, mem=21 * GIB)
        clock.now += 1.0
    core.flush()
    core = start(clock)  # a new collector on the same store: the job and its totals come back
    for seq in range(101, 201):
        _send(core, seq, clock.now, [_rank(clock.now, 150.0, 20 * GIB)], util=60.0, mem=21 * GIB)
        clock.now += 1.0
    job = core.state.jobs["a-1"]
    view = job_view(core.state, job, clock.now)
    (p,) = view.processes
    assert abs(p.cpu_seconds - 1.5 * 198) < 2.0, p.cpu_seconds  # the gap across the restart aside
    assert p.first_seen == T0
    (g,) = view.gpus
    assert abs(g.covered_seconds - 199) < 2.0 and abs(g.busy_seconds / g.covered_seconds - 0.6) < 1e-6
    assert g.memory_peak_bytes == 21 * GIB


def test_the_json_summary_carries_the_whole_job_totals(tmp_path):
    import json

    from clusterwatch.collector.state.summary import write_summary

    v = _view(state="COMPLETED", end_time=T0 + 3600)
    v.processes.add(node="n1", pid=11, rank=0, alive=False, rss_peak_bytes=40 * GIB, cpu_seconds=16 * 3600.0,
                    steps_per_s=0.0, stalled_since=T0 + 3000)
    v.gpus.add(node="n1", uuid="GPU-a", busy_seconds=1800.0, covered_seconds=3600.0,
               utilization_trend=[100.0, 100.0])
    doc = json.loads(open(write_summary(str(tmp_path), v)).read())
    assert doc["totals"] == {"run_time_s": 3600.0, "cpu_seconds": 57600.0, "cpu_efficiency": 0.5,
                             "rss_peak_bytes": 40 * GIB}
    assert doc["hardware"]["gpus"][0]["utilization_mean_percent"] == 50.0  # the whole job, not the trend
    (rank,) = doc["ranks"]
    assert rank["cpu_seconds"] == 57600.0 and rank["steps_per_s"] == 0.0 and rank["stalled_since"] == T0 + 3000


def test_notes_for_host_memory_that_grows_or_nears_the_allocation():
    v = _view()
    v.processes.add(node="n1", pid=11, rank=0, alive=True, rss_bytes=60 * GIB, rss_peak_bytes=60 * GIB,
                    rss_trend=[float(GIB * (10 + 5 * i)) for i in range(11)])
    notes = " ".join(render(v, now=T0 + 3600, width=None).split("\nNotes\n", 1)[1].split())
    assert "Host memory of rank 0 on n1 is growing (60.0 GiB now)" in notes
    assert "Host memory reached 60.0 GiB of the 64.0 GiB allocated" in notes and "--mem" in notes
    # a firing host_memory_leak has its own note: the trend's is not said twice
    v.alerts.add(rule="host_memory_leak", state="firing", node="n1", pid=11, rank=0, description="grows")
    notes = " ".join(render(v, now=T0 + 3600, width=None).split("\nNotes\n", 1)[1].split())
    assert "is growing (60.0 GiB now)" not in notes and "Host memory of rank 0 on n1 keeps growing" in notes


def test_cpu_without_cpu_time_or_cores_says_what_is_known_not_n_a():
    v = _view(cpus=0)
    v.processes.add(node="n1", pid=11, rank=0, alive=True, cpu_percent=250.0, rss_bytes=GIB)
    cpu = next(x for x in render(v, now=T0 + 5, width=None).splitlines() if x.startswith("  CPU "))
    assert cpu.split() == ["CPU", "2.5", "cores", "busy", "now;", "allocated", "cores", "unknown"], cpu
