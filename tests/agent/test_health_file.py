"""The agent's health file for the prolog's gate (agent/health_file.py), from the records of its batches."""
from __future__ import annotations

import os
import stat

from clusterwatch.agent.health_file import REFRESH_S, HealthFileWriter
from clusterwatch.v1 import agent_pb2

from clusterwatch.slurm.health_gate import FILE_NAME, HealthFile


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _read(spool) -> HealthFile:
    return HealthFile.from_json((spool / FILE_NAME).read_text())


def _names(spool) -> list[tuple[str, str]]:
    return [(f.gpu, f.name) for f in _read(spool).findings]


def test_a_lost_gpu_is_held_until_it_answers_again(tmp_path) -> None:
    clock = Clock()
    writer = HealthFileWriter(str(tmp_path), clock=clock)
    batch = agent_pb2.Batch()
    batch.health_events.add(kind="gpu_lost", uuid="GPU-a", time=990.0)
    writer.see(batch)
    health = _read(tmp_path)
    assert _names(tmp_path) == [("GPU-a", "gpu_lost")] and health.agent_pid == os.getpid()
    assert stat.S_IMODE(os.stat(tmp_path / FILE_NAME).st_mode) == 0o600
    writer.see(agent_pb2.Batch())
    assert _names(tmp_path) == [("GPU-a", "gpu_lost")]
    back = agent_pb2.Batch()
    back.gpu_health.add(uuid="GPU-a", time=1001.0)
    writer.see(back)
    assert _names(tmp_path) == [] and _read(tmp_path).counters_read_at == 1001.0


def test_counters_say_what_is_wrong_now_and_xids_stay(tmp_path) -> None:
    writer = HealthFileWriter(str(tmp_path), clock=Clock())
    batch = agent_pb2.Batch()
    batch.gpu_health.add(uuid="GPU-a", time=1.0, remapped_rows_pending=True, ecc_uncorrected_volatile=2)
    batch.gpu_health.add(uuid="GPU-b", time=1.0, remapped_rows_failure=True, ecc_uncorrected_volatile=0)
    for source in (agent_pb2.HealthEvent.KMSG, agent_pb2.HealthEvent.NVML):  # one XID, seen twice
        batch.health_events.add(kind="xid", uuid="GPU-b", xid=79, time=2.0, source=source)
    writer.see(batch)
    assert _names(tmp_path) == [("GPU-a", "ecc_uncorrected:2"), ("GPU-a", "row_remap_pending"),
                                ("GPU-b", "row_remap_failure"), ("GPU-b", "xid:79")]
    reset = agent_pb2.Batch()
    reset.gpu_health.add(uuid="GPU-a", time=3.0, remapped_rows_pending=False, ecc_uncorrected_volatile=0)
    reset.gpu_health.add(uuid="GPU-b", time=3.0)
    writer.see(reset)
    assert _names(tmp_path) == [("GPU-b", "xid:79")]


def test_it_is_rewritten_while_the_agent_runs_and_removed_when_it_stops(tmp_path) -> None:
    clock = Clock()
    writer = HealthFileWriter(str(tmp_path), clock=clock)
    writer.see(agent_pb2.Batch())
    first = _read(tmp_path).written_at
    clock.now += REFRESH_S / 2
    writer.see(agent_pb2.Batch())
    assert _read(tmp_path).written_at == first  # unchanged and not due: not written
    clock.now += REFRESH_S
    writer.see(agent_pb2.Batch())
    assert _read(tmp_path).written_at == clock.now
    writer.remove()
    assert not (tmp_path / FILE_NAME).exists()


def test_an_nvlink_down_is_held_until_it_is_up_and_the_gate_refuses_on_it(tmp_path) -> None:
    from clusterwatch.slurm.health_gate import decide

    writer = HealthFileWriter(str(tmp_path), clock=Clock())
    batch = agent_pb2.Batch()
    batch.gpu_health.add(uuid="GPU-a", time=1.0)
    batch.health_events.add(kind="nvlink_down", uuid="GPU-a", data=3, time=1.0, source=agent_pb2.HealthEvent.NVML)
    writer.see(batch)
    assert _names(tmp_path) == [("GPU-a", "nvlink_down:3")]
    writer.see(agent_pb2.Batch())   # the counters' next reading (the link still down) says nothing of it
    verdict = decide(_read(tmp_path), 1000.0, agent_running=True, needs_reset=lambda xid: False)
    assert verdict.refuse and verdict.reason == "clusterwatch gate: GPU-a: NVLink 3 is down"
    up = agent_pb2.Batch()
    up.health_events.add(kind="nvlink_up", uuid="GPU-a", data=3, time=2.0, source=agent_pb2.HealthEvent.NVML)
    writer.see(up)
    assert _names(tmp_path) == []
