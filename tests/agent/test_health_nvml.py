"""The health counters and the NVML event watcher through the real pynvml and the C stand-in.

Each case runs in a child process (pynvml loads the library once per process) that prints what
the health readers returned as JSON; the stand-in's call log shows what was asked of NVML.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.fakes.nvml_stub import child_env, fixtures, write_state

stub_lib = fixtures.stub_lib

GiB = 1024**3

COUNTERS = r"""
import dataclasses, json, sys, pynvml
from clusterwatch.agent.health.counters import CounterReader
from clusterwatch.agent.health.devices import physical_gpus
pynvml.nvmlInit()
out = {"pci": {g.uuid: g.pci for g in physical_gpus(pynvml)}}
reader = CounterReader(pynvml)
out["reads"], out["lost"] = [], []
for i in range(2):
    if i == 1 and len(sys.argv) > 1:       # the state of the second read
        import os
        os.replace(sys.argv[1], os.environ["NVML_STUB_STATE"])
    out["reads"].append([dataclasses.asdict(c) for c in reader.read(1000.0 + i)])
    out["lost"].append(sorted(reader.lost))
out["errors"] = reader.errors
reader.close()
print(json.dumps(out))
"""

EVENTS = r"""
import json, sys, threading, time, pynvml
from clusterwatch.agent.health.events import EventWatcher
got = []
watcher = EventWatcher(pynvml, lambda e: got.append([e.uuid, e.kind, e.data]), wait_ms=100).start()
deadline = time.monotonic() + 20
while len(got) < int(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.02)
t0 = time.monotonic()
watcher.stop()
print(json.dumps({"events": got, "registered": watcher.registered, "errors": watcher.errors,
                  "stop_seconds": time.monotonic() - t0}))
"""


def _child(stub_lib: Path, tmp_path: Path, state: str, code: str, *args: str) -> tuple[dict, list[list[str]]]:
    state_file, calls = tmp_path / "nvml-state.txt", tmp_path / "nvml-calls.txt"
    write_state(state_file, state)
    proc = subprocess.run([sys.executable, "-c", code, *args], env=child_env(stub_lib, state_file, calls),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = [line.split(" ", 1) for line in calls.read_text().splitlines()] if calls.exists() else []
    return json.loads(proc.stdout), log


def test_counters_through_the_real_bindings(stub_lib: Path, tmp_path: Path) -> None:
    state = (
        f"gpu GPU-aaaa total={80 * GiB} util=90 temp=83 throttle=0x28 pci=0000:3b:00 name=NVIDIA H100 80GB HBM3\n"
        f"gpu GPU-bbbb total={80 * GiB} util=0 name=NVIDIA A100-SXM4-80GB\n"
        "ecc GPU-aaaa corrected_volatile=5 uncorrected_volatile=1 corrected_aggregate=50 uncorrected_aggregate=2\n"
        "remapped GPU-aaaa corrected=3 uncorrected=1 pending=1 failure=0\n"
        "health GPU-aaaa viol_power_ns=2500000000 viol_thermal_ns=1000000000 replay=7 retired_dbe=2 "
        "nvlinks=2 nvlink_replay=3 nvlink_crc_flit=1\n"
        # GPU-bbbb: no row remapping and no violation counters (as before Ampere), PCIe replays
        # failing (counted, asked again), no NVLink
        "fail nvmlDeviceGetRemappedRows 3 GPU-bbbb\n"
        "fail nvmlDeviceGetViolationStatus 3 GPU-bbbb\n"
        "fail nvmlDeviceGetPcieReplayCounter 999 GPU-bbbb\n")
    out, calls = _child(stub_lib, tmp_path, state, COUNTERS)
    assert out["pci"] == {"GPU-aaaa": "0000:3b:00", "GPU-bbbb": "0000:11:00"}
    first, second = out["reads"]
    a, b = first
    assert a["uuid"] == "GPU-aaaa" and a["time"] == 1000.0
    assert (a["ecc_corrected_volatile"], a["ecc_uncorrected_volatile"], a["ecc_corrected_aggregate"],
            a["ecc_uncorrected_aggregate"]) == (5, 1, 50, 2)
    assert (a["remapped_rows_corrected"], a["remapped_rows_uncorrected"], a["remapped_rows_pending"],
            a["remapped_rows_failure"]) == (3, 1, True, False)
    assert (a["retired_pages_sbe"], a["retired_pages_dbe"], a["retired_pages_pending"]) == (0, 2, False)
    assert a["clock_event_reasons"] == 0x28
    assert a["violation_seconds"]["power"] == 2.5 and a["violation_seconds"]["thermal"] == 1.0
    assert (a["temperature_c"], a["pcie_replays"]) == (83, 7)
    assert a["nvlink_errors"] == {"replay": 6, "recovery": 0, "crc_flit": 2, "crc_data": 0}   # 2 links
    assert b["remapped_rows_pending"] is None and b["violation_seconds"] == {} and b["pcie_replays"] is None
    assert b["nvlink_errors"] == {} and b["temperature_c"] == 40
    assert second[1] == {**b, "time": 1001.0}
    assert out["errors"] == 2 and out["lost"] == [[], []]     # the two failed PCIe replay reads
    asked_b = [fn for fn, uuid in calls if uuid == "GPU-bbbb"]
    # what GPU-bbbb lacks was asked once; the failing call is asked again
    assert asked_b.count("nvmlDeviceGetRemappedRows") == 1
    assert asked_b.count("nvmlDeviceGetViolationStatus") == 6        # once per policy, over both reads
    assert asked_b.count("nvmlDeviceGetNvLinkErrorCounter") == 1
    assert asked_b.count("nvmlDeviceGetPcieReplayCounter") == 2
    # GPU-aaaa's two links are read at each read, and the third is not probed again
    asked_a = [fn for fn, uuid in calls if uuid == "GPU-aaaa"]
    assert asked_a.count("nvmlDeviceGetNvLinkErrorCounter") == 2 * 4 + 1 + 2 * 4


def test_a_gpu_lost_while_read_is_named_and_the_others_are_read(stub_lib: Path, tmp_path: Path) -> None:
    state = ("gpu GPU-aaaa util=90 temp=70 name=NVIDIA H100 80GB HBM3\n"
             "gpu GPU-bbbb util=0 temp=51 name=NVIDIA H100 80GB HBM3\n")
    lost = tmp_path / "lost.txt"
    lost.write_text(state.replace("util=90", "util=90 lost=1"))
    out, _ = _child(stub_lib, tmp_path, state, COUNTERS, str(lost))
    first, second = out["reads"]
    assert [(c["uuid"], c["temperature_c"]) for c in first] == [("GPU-aaaa", 70), ("GPU-bbbb", 51)]
    assert [(c["uuid"], c["temperature_c"]) for c in second] == [("GPU-bbbb", 51)]
    assert out["lost"] == [[], ["GPU-aaaa"]] and out["errors"] == 1


def test_events_through_the_real_bindings(stub_lib: Path, tmp_path: Path) -> None:
    state = ("gpu GPU-aaaa util=90 name=NVIDIA H100 80GB HBM3\n"
             "gpu GPU-bbbb util=0 events=0x0 name=NVIDIA H100 80GB HBM3\n"     # supports no event
             "gpu GPU-cccc util=0 events=0x3 name=NVIDIA H100 80GB HBM3\n"     # ECC only
             "event GPU-aaaa 0x8 79\n"
             "event GPU-bbbb 0x8 48\n"
             "event GPU-aaaa 0x4 0\n"          # a P-state change: not registered
             "event GPU-cccc 0x8 13\n"         # an XID on a GPU that cannot report them
             "event GPU-cccc 0x2 0\n"
             "event GPU-aaaa 0x8 13\n")
    out, calls = _child(stub_lib, tmp_path, state, EVENTS, "3")
    assert out["events"] == [["GPU-aaaa", "xid", 79], ["GPU-cccc", "ecc_double_bit", 0], ["GPU-aaaa", "xid", 13]]
    assert out["registered"] == {"GPU-aaaa": 0xB, "GPU-cccc": 0x3}   # P-state and clock left out
    assert out["errors"] == 0
    assert out["stop_seconds"] < 5.0      # generous: one wait is 0.1 s
    assert ["nvmlEventSetFree", "-"] in calls
    assert ["nvmlDeviceRegisterEvents", "GPU-bbbb"] not in calls


def test_a_watcher_with_nothing_to_watch_stops_at_once(stub_lib: Path, tmp_path: Path) -> None:
    out, calls = _child(stub_lib, tmp_path, "gpu GPU-aaaa events=0x0 name=X\n", EVENTS, "0")
    assert out["events"] == [] and out["registered"] == {}
    assert out["stop_seconds"] < 5.0


OLD_BINDINGS = r"""
import json, time, types, pynvml
from clusterwatch.agent.health.events import EventWatcher
# bindings from before nvmlEventSetWait_v2: everything else as the installed pynvml has it
old = types.SimpleNamespace(**{k: getattr(pynvml, k) for k in dir(pynvml) if k != "nvmlEventSetWait_v2"})
got = []
watcher = EventWatcher(old, lambda e: got.append([e.uuid, e.kind, e.data]), wait_ms=100).start()
deadline = time.monotonic() + 20
while not got and time.monotonic() < deadline:
    time.sleep(0.02)
watcher.stop()
print(json.dumps({"events": got, "errors": watcher.errors}))
"""


def test_bindings_without_the_v2_wait_use_the_first(stub_lib: Path, tmp_path: Path) -> None:
    out, calls = _child(stub_lib, tmp_path, "gpu GPU-aaaa util=9 name=X\nevent GPU-aaaa 0x8 48\n", OLD_BINDINGS)
    assert out == {"events": [["GPU-aaaa", "xid", 48]], "errors": 0}


class _WedgedNvml:
    """Just enough NVML for a watcher with no GPUs whose event wait does not come back until released."""

    class NVMLError(Exception):
        pass

    def __init__(self) -> None:
        import threading

        self.calls: list[str] = []
        self.waiting = threading.Event()
        self.release = threading.Event()

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceGetCount(self) -> int:
        return 0

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> None:
        self.waiting.set()
        self.release.wait(30)   # a driver call: deaf to the watcher's stop
        raise self.NVMLError("timeout")

    def nvmlEventSetFree(self, event_set: object) -> None:
        self.calls.append("nvmlEventSetFree")

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")


def test_a_watcher_stuck_in_the_driver_keeps_its_event_set() -> None:
    from clusterwatch.agent.health.events import EventWatcher

    nvml = _WedgedNvml()
    watcher = EventWatcher(nvml, lambda e: None, wait_ms=100).start()
    assert nvml.waiting.wait(10)
    try:
        watcher.stop(timeout=0.05)
        assert nvml.calls == ["nvmlInit"]   # freeing the set under the wait would crash the agent
    finally:
        nvml.release.set()
    watcher.stop(timeout=10)
    assert nvml.calls == ["nvmlInit", "nvmlEventSetFree", "nvmlShutdown"]


LINKS = r"""
import json, os, sys, pynvml
from clusterwatch.agent.health.counters import CounterReader
reader = CounterReader(pynvml)
out = []
for i, state in enumerate([None] + sys.argv[1:]):
    if state:
        os.replace(state, os.environ["NVML_STUB_STATE"])
    reader.read(1000.0 + i)
    out.append([[c.uuid, c.link, c.down] for c in reader.nvlink_changes])
print(json.dumps({"changes": out, "errors": reader.errors}))
reader.close()
"""


def test_an_nvlink_that_goes_down_is_a_change_and_a_gpu_without_nvlink_is_asked_once(stub_lib: Path,
                                                                                        tmp_path: Path) -> None:
    gpus = f"gpu GPU-aaaa total={80 * GiB} name=NVIDIA H100\ngpu GPU-bbbb total={80 * GiB} name=NVIDIA L40S\n"
    states = []
    # GPU-aaaa: four links, link 1 down from the start (never seen active: no change); GPU-bbbb: no NVLink
    for i, bits in enumerate(["1011", "1001", "1001", "1011", "1111"]):
        path = tmp_path / f"state-{i}.txt"
        path.write_text(gpus + f"health GPU-aaaa nvlinks=4 nvlink_state={bits}\n")
        states.append(str(path))
    out, calls = _child(stub_lib, tmp_path, Path(states[0]).read_text(), LINKS, *states[1:])
    assert out["changes"] == [[], [["GPU-aaaa", 2, True]], [], [["GPU-aaaa", 2, False]], []]
    assert out["errors"] == 0
    state_calls = [uuid for fn, uuid in calls if fn == "nvmlDeviceGetNvLinkState"]
    assert state_calls.count("GPU-bbbb") == 1
    # the first read asks every link NVML may have (36), the later ones the GPU's four
    assert state_calls.count("GPU-aaaa") == 36 + 4 * 4
