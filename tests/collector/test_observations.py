"""The collector's state as the engine's observations (collector/state/observations.py): each derived field once."""
from __future__ import annotations

from importlib import resources

import orjson
from clusterwatch.collector.rules import Engine, ProcessObservation, load_rules
from clusterwatch.collector.state.cluster import (
    ClusterState,
    GpuSeries,
    JobState,
    NodeState,
    ProcessSeries,
    process_history,
)
from clusterwatch.collector.state.observations import (
    allocation_room,
    gpu_figures,
    gpu_from_record,
    gpu_memory_total,
    gpu_record,
    heartbeat_from_record,
    heartbeat_record,
    node_observations,
    observation_record,
    process_from_record,
)
from clusterwatch.collector.traces.replay import replay_lines

from clusterwatch.model import GpuInfo, GpuReading, GpuUse, ProcessKey, ProcessSample

GIB = 1 << 30
T0 = 1_800_000_000.0


def _state() -> tuple[ClusterState, list[ProcessSeries]]:
    state = ClusterState()
    state.nodes["n1"] = NodeState("n1", memory_total_bytes=512 * GIB, send_interval_s=5.0, gpus=["GPU-a", "GPU-b"])
    state.gpus["GPU-a"] = GpuSeries("n1", GpuInfo("GPU-a", 0, "H100", 80 * GIB),
                                    latest=GpuReading("GPU-a", utilization=97.0, power_watts=650.0))
    state.gpus["GPU-b"] = GpuSeries("n1", GpuInfo("GPU-b", 1, "H100", 80 * GIB),
                                    latest=GpuReading("GPU-b", utilization=0.0, memory_total_bytes=79 * GIB))
    state.jobs["7"] = JobState("7", name="train", partition="gpu", nodes=["n1", "n2"], memory_bytes=16 * GIB,
                               gpus_by_node={"n1": ["GPU-a", "GPU-b"]})
    touched = []
    for pid, rank, gpus in ((11, 0, (GpuUse("GPU-a", 30 * GIB, 95.0),)),
                            (12, 1, (GpuUse("GPU-a", 2 * GIB, 10.0), GpuUse("GPU-b", 4 * GIB, 30.0)))):
        key = ProcessKey("n1", pid, T0 - 10)
        sample = ProcessSample(T0, "n1", pid, T0 - 10, user="ana", command="python", job_id="7", rank=rank,
                               cpu_percent=99.0, rss_bytes=(rank + 1) * GIB, threads=12, open_fds=40, gpus=gpus)
        series = ProcessSeries(key, sample, process_history(720))
        state.processes[key] = series
        touched.append(series)
    return state, touched


def test_a_batch_becomes_the_observations_of_its_processes_gpus_and_node():
    state, touched = _state()
    seen = node_observations(state, "n1", touched, state.gpu_allocations(), T0, min_interval_s=5.0)
    first, second = seen.processes
    # the job's share of the node (16 GiB over 2 nodes) less what its ranks here hold (3 GiB), plus its own RSS
    assert first == ProcessObservation(
        T0, "n1", "7", 11, T0 - 10, "GPU-a", 0, "ana", "python", "train", "gpu", 30 * GIB, 80 * GIB, 95.0, 99.0,
        GIB, 512 * GIB, 5 * GIB + GIB, 12, 40, None)
    # on two GPUs: the first names it (its size its latest reading's), its memory over both, its busiest utilisation
    assert (second.gpu, second.gpu_mem_total_bytes, second.gpu_mem_bytes, second.gpu_util) == \
        ("GPU-a", 80 * GIB, 6 * GIB, 30.0)
    assert [(g.gpu, g.job_id, g.processes, g.index, g.utilization, g.power_watts) for g in seen.gpus] == \
        [("GPU-a", "7", 2, 0, 97.0, 650.0), ("GPU-b", "7", 1, 1, 0.0, None)]
    assert (seen.heartbeat.has_jobs, seen.heartbeat.every_s, seen.heartbeat.job_ids) == (True, 5.0, ("7",))


def test_a_process_is_observed_at_most_every_min_interval():
    state, touched = _state()
    owners = state.gpu_allocations()
    assert len(node_observations(state, "n1", touched, owners, T0, 5.0).processes) == 2
    for series in touched:
        series.latest.time = T0 + 4
    assert node_observations(state, "n1", touched, owners, T0 + 4, 5.0).processes == []
    touched[0].latest.time = T0 + 5
    assert [o.pid for o in node_observations(state, "n1", touched, owners, T0 + 5, 5.0).processes] == [11]


def test_the_derivations_record_shares():
    state, touched = _state()
    assert gpu_memory_total(state, "GPU-b") == 79 * GIB   # the reading's size before the inventory's
    assert gpu_memory_total(state, "GPU-x") is None
    assert gpu_figures(touched[1].latest) == (6 * GIB, 30.0)
    assert allocation_room(8 * GIB, 10 * GIB) == 0   # over the allocation: no room, never less


def test_a_process_line_is_the_observation_written_down():
    state, touched = _state()
    obs = node_observations(state, "n1", touched, state.gpu_allocations(), T0, 5.0).processes[0]
    line = observation_record(obs)
    assert ProcessObservation(**line) == obs   # every field known, by its own name
    assert "user" not in observation_record(obs, labels=False)
    bare = observation_record(ProcessObservation(T0, "n1", pid=3))
    assert bare == {"t": T0, "node": "n1", "pid": 3, "start_time": 0.0}   # unknown and empty fields left out


def test_the_observations_written_down_replay_to_the_live_events():
    # what the live rules take, written as trace lines and replayed, raises the same alerts: here a host leak
    # measured against the job's allocation (the ceiling and its name travel in the line)
    rules = load_rules(resources.files("clusterwatch.collector.rules") / "demo_rules.toml")
    state, touched = _state()
    owners = state.gpu_allocations()
    live, lines, seen = Engine(rules), [], set()
    events = []
    for i in range(400):
        t = T0 + 5 * i
        for series in touched:
            series.latest.time = t
        touched[0].latest.rss_bytes = GIB + i * 20 * (1 << 20)
        for obs in node_observations(state, "n1", touched, owners, t, 5.0).processes:
            events += live.observe(obs)
            lines.append(orjson.dumps(observation_record(obs, labels=obs.pid not in seen)))
            seen.add(obs.pid)
    fired = [e.to_dict() for e in events]
    assert any(e["rule"] == "host_memory_leak" and "the job's memory allocation" in e["description"]
               for e in fired), fired
    assert [e.to_dict() for e in replay_lines(iter(lines), rules)] == fired


def test_gpu_and_node_records_read_back_as_the_observations_written():
    state, touched = _state()
    seen = node_observations(state, "n1", touched, state.gpu_allocations(), T0, 5.0)
    for gpu in seen.gpus:
        assert gpu_from_record(orjson.loads(orjson.dumps(gpu_record(gpu)))) == gpu
    assert gpu_record(seen.gpus[1], parent="GPU-whole")["parent"] == "GPU-whole"
    # a trace is one job's: the heartbeat's jobs are not written, the rest reads back
    hb = heartbeat_from_record(orjson.loads(orjson.dumps(heartbeat_record(seen.heartbeat))))
    assert (hb.t, hb.node, hb.has_jobs, hb.every_s, hb.job_ids) == (T0, "n1", True, 5.0, ())


def test_a_process_line_reads_back_as_the_observation_written():
    state, touched = _state()
    for obs in node_observations(state, "n1", touched, state.gpu_allocations(), T0, 5.0).processes:
        assert process_from_record(orjson.loads(orjson.dumps(observation_record(obs)))) == obs
    # what a line leaves out takes the defaults; a GPU written as an index reads as its text
    bare = process_from_record({"t": 5.0, "node": "n1", "pid": 7, "gpu": 3})
    assert bare == ProcessObservation(5.0, "n1", pid=7, gpu="3")
    for missing in ("t", "node", "pid"):
        line = {"t": 5.0, "node": "n1", "pid": 7}
        del line[missing]
        try:
            process_from_record(line)
        except KeyError:
            continue
        raise AssertionError(f"a line without {missing} read back")


def test_a_read_without_rss_does_not_rename_what_a_host_leak_fills():
    # a leak measured against the job's allocation keeps that name through an observation whose RSS could not be
    # read (it carries no ceiling), live as in replay: the engine's one input, read the same way
    eng = Engine(load_rules(resources.files("clusterwatch.collector.rules") / "demo_rules.toml"))
    for i in range(400):
        t = T0 + 60.0 * i
        rss = GIB + i * 20 * (1 << 20)
        eng.observe(ProcessObservation(t, "n1", "7", 11, T0 - 10, rss_bytes=rss, node_mem_total_bytes=512 * GIB,
                                       job_mem_total_bytes=rss + 2 * GIB))
    p = eng._procs[("n1", 11, T0 - 10)]
    assert p.host_full == "the job's memory allocation"
    eng.observe(ProcessObservation(T0 + 60.0 * 400, "n1", "7", 11, T0 - 10, node_mem_total_bytes=512 * GIB))
    assert p.host_full == "the job's memory allocation"
    eng.observe(ProcessObservation(T0 + 60.0 * 401, "n1", "7", 11, T0 - 10, rss_bytes=GIB,
                                   node_mem_total_bytes=512 * GIB))
    assert p.host_full == "node memory"
