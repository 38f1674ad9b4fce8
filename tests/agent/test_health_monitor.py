"""The agent's health monitor: kernel log, NVML events and counters into the batch, through the stand-in."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.fakes.nvml_stub import child_env, fixtures, write_state

stub_lib = fixtures.stub_lib

MONITOR = r"""
import json, sys, time, pynvml
from google.protobuf.json_format import MessageToDict
from clusterwatch.v1 import agent_pb2
from clusterwatch.agent.health.monitor import HealthMonitor
m = HealthMonitor(pynvml, sys.argv[1], counters_every_s=0.1, kmsg_boot_time=1_000_000.0, boot_id="boot-1")
parts = m.parts
m.start()
batch = agent_pb2.Batch()
deadline = time.monotonic() + 20
while (len(batch.health_events) < 2 or len(batch.gpu_health) < 2) and time.monotonic() < deadline:
    time.sleep(0.05)
    m.drain_into(batch)
t0 = time.monotonic()
m.stop()
print(json.dumps({"parts": parts, "batch": MessageToDict(batch, preserving_proto_field_name=True),
                  "stop_seconds": time.monotonic() - t0, "errors": m.errors}))
"""


def test_the_monitor_puts_kernel_log_xids_nvml_events_and_counters_into_the_batch(stub_lib: Path,
                                                                                    tmp_path: Path) -> None:
    state = tmp_path / "nvml-state.txt"
    write_state(state, "gpu GPU-aaaa util=90 temp=77 pci=0000:3b:00 name=NVIDIA H100 80GB HBM3\n"
                       "event GPU-aaaa 0x2 0\n")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("3,41,2500000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, "
                    "GPU has fallen off the bus.\n")
    proc = subprocess.run([sys.executable, "-c", MONITOR, str(kmsg)], env=child_env(stub_lib, state),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout)
    assert out["parts"] == ["kmsg", "nvml"]
    events = {e["source"]: e for e in out["batch"]["health_events"]}
    assert events["KMSG"] == {"time": 1_000_002.5, "uuid": "GPU-aaaa", "kind": "xid", "xid": 79, "data": "79",
                              "pid": 1234, "process": "python", "pci": "0000:3b:00", "source": "KMSG",
                              "text": "GPU has fallen off the bus.", "kernel_boot_id": "boot-1", "kmsg_seq": "41"}
    assert events["NVML"]["kind"] == "ecc_double_bit" and events["NVML"]["uuid"] == "GPU-aaaa"
    health = out["batch"]["gpu_health"][0]
    assert health["uuid"] == "GPU-aaaa" and health["temperature_c"] == 77
    assert "pcie_replays" in health and "ecc_uncorrected_volatile" in health
    assert out["stop_seconds"] < 5.0 and out["errors"] == 0


def test_no_kernel_log_and_no_nvml_is_no_monitor(tmp_path: Path) -> None:
    from clusterwatch.agent.health.monitor import HealthMonitor, open_health

    assert open_health("sim", None) is None
    m = HealthMonitor(None, str(tmp_path / "missing"))
    assert m.parts == []        # one line said why; the agent runs on


LOSS = r"""
import json, os, sys, time, pynvml
from clusterwatch.v1 import agent_pb2
from clusterwatch.agent.health.monitor import HealthMonitor
m = HealthMonitor(pynvml, None, counters_every_s=0.05, boot_id="boot-1").start()
batch = agent_pb2.Batch()
deadline = time.monotonic() + 20
while not batch.gpu_health and time.monotonic() < deadline:
    time.sleep(0.02)
    m.drain_into(batch)
os.replace(sys.argv[1], os.environ["NVML_STUB_STATE"])        # the GPU falls off the bus
time.sleep(1.0)                                               # many reads of the lost GPU
m.drain_into(batch)
m.stop()
print(json.dumps([[e.uuid, e.kind] for e in batch.health_events]))
"""


def test_a_gpu_that_answers_lost_is_said_once(stub_lib: Path, tmp_path: Path) -> None:
    state = tmp_path / "nvml-state.txt"
    good = "gpu GPU-aaaa util=90 name=NVIDIA H100 80GB HBM3\ngpu GPU-bbbb util=9 name=NVIDIA H100 80GB HBM3\n"
    write_state(state, good)
    lost = tmp_path / "lost.txt"
    lost.write_text(good.replace("util=90", "util=90 lost=1"))
    proc = subprocess.run([sys.executable, "-c", LOSS, str(lost)], env=child_env(stub_lib, state),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout) == [["GPU-aaaa", "gpu_lost"]]


WEDGED = r"""
import json, time, pynvml
from clusterwatch.agent.health.monitor import HealthMonitor
t0 = time.monotonic()
m = HealthMonitor(pynvml, None, counters_every_s=0.1, boot_id="b").start()
started = time.monotonic() - t0
time.sleep(0.5)
t0 = time.monotonic()
m.stop()
print(json.dumps({"start": started, "stop": time.monotonic() - t0}))
"""


def test_a_wedged_gpu_holds_up_neither_the_start_nor_the_stop(stub_lib: Path, tmp_path: Path) -> None:
    state = tmp_path / "nvml-state.txt"
    write_state(state, "gpu GPU-good util=9 name=NVIDIA H100\ngpu GPU-slow util=9 name=NVIDIA H100\n"
                       "delay * 3000 GPU-slow\n")     # every call on that GPU takes 3 s
    proc = subprocess.run([sys.executable, "-c", WEDGED], env=child_env(stub_lib, state),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout)
    assert out["start"] < 1.0 and out["stop"] < 2.5     # generous: a call on the wedged GPU is 3 s
