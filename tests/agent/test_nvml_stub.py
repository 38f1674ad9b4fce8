"""The NVML source through the real pynvml bindings, against the C stand-in for the driver library.

Each case runs the source in a child process that loads tests/fakes/nvml_stub/libnvml.c (built
here with the system C compiler) as libnvidia-ml.so.1, so pynvml's own ctypes structs, size
queries and `_v3`/unversioned/`_v2` fallbacks are what is tested. No GPU is needed or used.
"""
from __future__ import annotations

import inspect
import time
from pathlib import Path

import pynvml
import pytest

from tests.fakes import fake_pynvml
from tests.fakes.nvml_stub import drive, fixtures
from tests.support.helpers import ROOT

# the stand-in's fixtures, used by name
stub_lib, stub_lib_no_v3, live_pids = fixtures.stub_lib, fixtures.stub_lib_no_v3, fixtures.live_pids

GiB = 1024**3


def gpus(*, util: int = 75) -> str:
    return (f"gpu GPU-aaaa total={80 * GiB} used={10 * GiB} util={util} power=312500 name=NVIDIA H100 80GB HBM3\n"
            f"gpu GPU-bbbb total={80 * GiB} used={2 * GiB} util=0 power=61250 name=NVIDIA A100-SXM4-80GB\n")


def uses(poll: dict, pid: int) -> list[list]:
    return poll["processes"].get(str(pid), [])


def by_uuid(poll: dict) -> dict[str, list]:
    return {r[0]: r for r in poll["readings"]}


# --- the Python fake stays honest -------------------------------------------------------------

def test_the_python_fake_offers_only_what_pynvml_has_with_the_same_parameters() -> None:
    fake = fake_pynvml.FakeNvml([])
    names = [n for n in dir(fake) if n.startswith("nvml")]
    assert len(names) >= 15
    for name in names:
        assert hasattr(pynvml, name), f"pynvml has no {name}"
        fake_params = list(inspect.signature(getattr(fake, name)).parameters)
        real_params = list(inspect.signature(getattr(pynvml, name)).parameters)
        assert fake_params == real_params, name
    for name in [n for n in dir(fake_pynvml) if n.startswith("NVMLError_")]:
        real = getattr(pynvml, name)
        assert issubclass(real, pynvml.NVMLError)
        assert getattr(fake_pynvml, name)().value == real().value, name
    assert not issubclass(pynvml.NVMLLibraryMismatchError, pynvml.NVMLError)
    assert fake_pynvml.NVML_DEVICE_MIG_ENABLE == pynvml.NVML_DEVICE_MIG_ENABLE


# --- the basic case ---------------------------------------------------------------------------

def test_readings_and_processes_through_the_real_bindings(stub_lib: Path, tmp_path: Path,
                                                          live_pids: list[int]) -> None:
    a, b = live_pids[:2]
    state = gpus() + (f"proc GPU-aaaa {a} {3 * GiB}\n"
                      f"proc GPU-aaaa {b} na graphics\n"        # NVML_VALUE_NOT_AVAILABLE
                      f"proc GPU-bbbb {a} {GiB} compute\n"
                      f"sample GPU-aaaa {a} 60 age_us=200000\n"
                      f"sample GPU-aaaa {a} 140 age_us=100000\n")  # clamped to 100
    out = drive(stub_lib, tmp_path, [{"state": state, "now": time.time()}])
    assert out["open_error"] is None
    assert out["inventory"] == [["GPU-aaaa", 0, "NVIDIA H100 80GB HBM3", 80 * GiB],
                                ["GPU-bbbb", 1, "NVIDIA A100-SXM4-80GB", 80 * GiB]]
    [poll] = out["polls"]
    assert poll["errors"] == 0
    assert by_uuid(poll) == {"GPU-aaaa": ["GPU-aaaa", 75.0, 10 * GiB, 80 * GiB, 312.5],
                             "GPU-bbbb": ["GPU-bbbb", 0.0, 2 * GiB, 80 * GiB, 61.25]}
    assert uses(poll, a) == [["GPU-aaaa", 3 * GiB, 100.0], ["GPU-bbbb", GiB, 0.0]]
    assert uses(poll, b) == [["GPU-aaaa", None, 0.0]]


def test_a_driver_older_than_r510_lists_processes_through_the_v2_functions(
        stub_lib_no_v3: Path, tmp_path: Path, live_pids: list[int]) -> None:
    a = live_pids[0]
    state = gpus() + f"proc GPU-aaaa {a} {3 * GiB}\nproc GPU-bbbb {a} {GiB} graphics\n"
    out = drive(stub_lib_no_v3, tmp_path, [{"state": state, "now": time.time()}] * 2, calls=True)
    for poll in out["polls"]:
        assert poll["errors"] == 0
        assert [u[:2] for u in uses(poll, a)] == [["GPU-aaaa", 3 * GiB], ["GPU-bbbb", GiB]]
    called = [c[0] for c in out["calls"]]
    # _v3 is not in the library: never called; then _v2 every poll, one call each (the buffer
    # kept from the last poll is large enough: no size query first), on the GPU with a compute process.
    assert out["calls"].count(["nvmlDeviceGetComputeRunningProcesses_v2", "GPU-aaaa"]) == 2
    assert "nvmlDeviceGetComputeRunningProcesses_v3" not in called  # absent: never reached the library


def test_no_gpu_is_one_line(stub_lib: Path, tmp_path: Path) -> None:
    out = drive(stub_lib, tmp_path, [{"state": "", "now": time.time()}])
    assert out["open_error"].startswith("NVML found no usable GPU on this node")


def test_init_error_is_one_line(stub_lib: Path, tmp_path: Path) -> None:
    out = drive(stub_lib, tmp_path, [{"state": gpus() + "init_error 9\n", "now": time.time()}])
    assert out["open_error"].startswith("NVIDIA driver not loaded")


# --- 1: a listed process with no sample is idle ------------------------------------------------

def test_a_listed_process_without_a_sample_reads_idle_not_unknown(stub_lib: Path, tmp_path: Path,
                                                                  live_pids: list[int]) -> None:
    busy, idle = live_pids[:2]
    t = time.time()
    state = gpus() + (f"proc GPU-aaaa {busy} {GiB}\nproc GPU-aaaa {idle} {GiB}\n"
                      f"sample GPU-aaaa {busy} 80 ts={int((t - 0.5) * 1e6)}\n")
    out = drive(stub_lib, tmp_path, [{"state": state, "now": t},
                                     {"state": state, "now": t + 30},   # past any hold, no newer sample
                                     ], source={"util_hold_s": 10.0})
    first, later = out["polls"]
    assert uses(first, busy) == [["GPU-aaaa", GiB, 80.0]]
    # NVML keeps samples only for processes that used the GPU: the GPU answered, so 0 %.
    assert uses(first, idle) == [["GPU-aaaa", GiB, 0.0]]
    assert uses(later, busy) == [["GPU-aaaa", GiB, 0.0]]
    assert later["errors"] == 0


def test_a_failed_utilisation_query_leaves_the_figure_unknown(stub_lib: Path, tmp_path: Path,
                                                              live_pids: list[int]) -> None:
    pid = live_pids[0]
    state = gpus() + f"proc GPU-aaaa {pid} {GiB}\nfail nvmlDeviceGetProcessUtilization 10 GPU-aaaa\n"
    [poll] = drive(stub_lib, tmp_path, [{"state": state, "now": time.time()}])["polls"]
    assert uses(poll, pid) == [["GPU-aaaa", GiB, None]]  # Timeout: not known, not idle
    assert poll["errors"] == 1


# --- 5: each reading fails alone --------------------------------------------------------------

def test_an_unknown_error_in_one_query_fails_that_reading_only(stub_lib: Path, tmp_path: Path,
                                                                live_pids: list[int]) -> None:
    pid = live_pids[0]
    base = gpus() + f"proc GPU-aaaa {pid} {3 * GiB}\n"
    failing = base + "fail nvmlDeviceGetProcessUtilization 999 GPU-aaaa\n"
    power_fails = base + "fail nvmlDeviceGetPowerUsage 999 GPU-aaaa\n"
    t = time.time()
    out = drive(stub_lib, tmp_path, [{"state": failing, "now": t}, {"state": failing, "now": t + 5},
                                     {"state": power_fails, "now": t + 10}])
    for poll in out["polls"][:2]:
        assert poll["errors"] == 1
        assert by_uuid(poll)["GPU-aaaa"] == ["GPU-aaaa", 75.0, 10 * GiB, 80 * GiB, 312.5]
        assert uses(poll, pid) == [["GPU-aaaa", 3 * GiB, None]]
    third = out["polls"][2]
    assert third["errors"] == 1
    assert by_uuid(third)["GPU-aaaa"] == ["GPU-aaaa", 75.0, 10 * GiB, 80 * GiB, None]
    assert uses(third, pid) == [["GPU-aaaa", 3 * GiB, 0.0]]


# --- 4: a lost GPU is a gap -------------------------------------------------------------------

def test_a_lost_gpu_has_no_reading_and_is_stale_not_freed(stub_lib: Path, tmp_path: Path,
                                                          live_pids: list[int]) -> None:
    a, b = live_pids[:2]
    procs = f"proc GPU-aaaa {a} {3 * GiB}\nproc GPU-bbbb {b} {GiB}\n"
    lost = gpus().replace("power=312500", "power=312500 lost=1") + procs
    t = time.time()
    out = drive(stub_lib, tmp_path, [{"state": gpus() + procs, "now": t}, {"state": lost, "now": t + 5},
                                     {"state": lost, "now": t + 10}, {"state": gpus() + procs, "now": t + 15}])
    first, *gone, back = out["polls"]
    assert set(by_uuid(first)) == {"GPU-aaaa", "GPU-bbbb"}
    for poll in gone:
        # No reading at all (an empty one read as "answered, nothing there"), marked stale; its
        # process still on it, with no figures (not "no process", not memory dropped to zero).
        assert set(by_uuid(poll)) == {"GPU-bbbb"}
        assert poll["stale"] == ["GPU-aaaa"]
        assert poll["errors"] == 1
        assert uses(poll, a) == [["GPU-aaaa", None, None]] and uses(poll, b) == [["GPU-bbbb", GiB, 0.0]]
        assert [g[0] for g in poll["inventory"]] == ["GPU-aaaa", "GPU-bbbb"]
    assert back["stale"] == [] and uses(back, a) == [["GPU-aaaa", 3 * GiB, 0.0]]
    assert sum("GPU-aaaa" in line and "does not answer" in line for line in out["log"]) == 1


# --- 6: stale and frozen utilisation ----------------------------------------------------------

def test_a_first_query_does_not_take_minutes_old_samples_as_current(stub_lib: Path, tmp_path: Path,
                                                                    live_pids: list[int]) -> None:
    pid = live_pids[0]
    t = time.time()
    state = gpus() + f"proc GPU-aaaa {pid} {GiB}\nsample GPU-aaaa {pid} 95 ts={int((t - 120) * 1e6)}\n"
    [poll] = drive(stub_lib, tmp_path, [{"state": state, "now": t}], source={"interval_s": 5.0})["polls"]
    assert uses(poll, pid) == [["GPU-aaaa", GiB, 0.0]]


@pytest.mark.parametrize("step_s", [-3600.0, 3600.0])
def test_utilisation_survives_a_clock_step(stub_lib: Path, tmp_path: Path, live_pids: list[int],
                                           step_s: float) -> None:
    pid = live_pids[0]
    t = time.time()
    before = f"sample GPU-aaaa {pid} 40 ts={int((t - 0.5) * 1e6)}\n"
    base = gpus() + f"proc GPU-aaaa {pid} {GiB}\n" + before
    steps = [{"state": base, "now": t}]
    for i in range(1, 4):  # after the step: new samples, stamped with the stepped clock
        now = t + step_s + 5 * i
        base += f"sample GPU-aaaa {pid} {50 + i} ts={int((now - 0.5) * 1e6)}\n"
        steps.append({"state": base, "now": now})
    out = drive(stub_lib, tmp_path, steps, source={"interval_s": 5.0, "util_hold_s": 10.0})
    assert [uses(p, pid)[0][2] for p in out["polls"]] == [40.0, 51.0, 52.0, 53.0]


# --- 2: bindings and pids ---------------------------------------------------------------------

def test_a_pid_that_is_no_process_of_this_host_is_dropped_and_counted(stub_lib: Path, tmp_path: Path,
                                                                      live_pids: list[int]) -> None:
    pid = live_pids[0]
    # What bindings with a struct of the wrong size read: the bytes of the next field as pids.
    state = gpus() + f"proc GPU-aaaa {pid} {GiB}\nproc GPU-aaaa 4294967295 {GiB}\nproc GPU-aaaa 2147483648 0\n"
    out = drive(stub_lib, tmp_path, [{"state": state, "now": time.time()}] * 2)
    for poll in out["polls"]:
        assert set(poll["processes"]) == {str(pid)}
        assert poll["errors"] == 2
    assert sum("not a process of this host" in line for line in out["log"]) == 1


def test_the_pin_excludes_bindings_whose_structs_do_not_match() -> None:
    import tomllib
    from packaging.requirements import Requirement
    from packaging.version import Version

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [req] = [Requirement(d) for d in deps if d.startswith("nvidia-ml-py")]
    # 12.535.77: a 32-byte _v3 process struct (the driver's is 24); 12.535.108-161: no _v2
    # wrappers; 12.550.52 is the first with both right (see docs/gpus.md).
    for bad in ("11.525.150", "12.535.77", "12.535.161"):
        assert Version(bad) not in req.specifier, bad
    for good in ("12.550.52", "12.575.51", "13.580.65", "13.615.71"):
        assert Version(good) in req.specifier, good
    from importlib.metadata import version

    assert Version(version("nvidia-ml-py")) in req.specifier


# --- 9: MPS -----------------------------------------------------------------------------------

def test_processes_served_through_mps_are_listed_under_their_own_pids(stub_lib: Path, tmp_path: Path,
                                                                      live_pids: list[int]) -> None:
    server, c1, c2 = live_pids[:3]
    # Under MPS the compute list names the MPS server; the clients are in the MPS list.
    state = gpus() + (f"proc GPU-aaaa {server} {GiB // 4}\n"
                      f"proc GPU-aaaa {c1} {2 * GiB} mps\nproc GPU-aaaa {c2} {3 * GiB} mps\n")
    [poll] = drive(stub_lib, tmp_path, [{"state": state, "now": time.time()}])["polls"]
    assert uses(poll, c1) == [["GPU-aaaa", 2 * GiB, 0.0]]
    assert uses(poll, c2) == [["GPU-aaaa", 3 * GiB, 0.0]]
    assert uses(poll, server) == [["GPU-aaaa", GiB // 4, 0.0]]
    assert poll["errors"] == 0


# --- 10: containers ---------------------------------------------------------------------------

def test_an_agent_in_its_own_pid_namespace_says_so_once_and_attributes_no_pids(
        stub_lib: Path, tmp_path: Path, live_pids: list[int]) -> None:
    pid = live_pids[0]
    state = gpus() + f"proc GPU-aaaa {pid} {GiB}\n"
    out = drive(stub_lib, tmp_path, [{"state": state, "now": time.time()}] * 2,
                source={"nested_pid_namespace": True})
    assert out["pids_hidden"] is True
    [line] = [m for m in out["log"] if "PID namespace" in m]
    assert "pid: host" in line
    for poll in out["polls"]:
        assert poll["processes"] == {} and poll["errors"] == 0
        assert by_uuid(poll)["GPU-aaaa"][2] == 10 * GiB  # the GPU's own memory still shows


# --- 7: a wedged GPU holds up only itself -----------------------------------------------------

@pytest.mark.serial  # times a poll against its 0.5 s deadline (under 0.5 s, 1.4 s): other tests' load would stretch it
def test_a_wedged_gpu_reads_stale_within_the_deadline_and_the_others_go_on(
        stub_lib: Path, tmp_path: Path, live_pids: list[int]) -> None:
    a, b = live_pids[:2]
    normal = gpus() + f"proc GPU-aaaa {a} {GiB}\nproc GPU-bbbb {b} {GiB}\n"
    wedged = normal + "delay * 1500 GPU-bbbb\n"  # every call on GPU-bbbb takes 1.5 s
    t = time.time()
    out = drive(stub_lib, tmp_path, [
        {"state": normal, "now": t},
        {"state": wedged, "now": t + 1},
        {"state": wedged, "now": t + 2},
        {"state": normal, "now": t + 3, "pause": 12.0},  # the calls in flight finish meanwhile
    ], source={"deadline_s": 0.5})
    first, slow, still, back = out["polls"]
    assert set(by_uuid(first)) == {"GPU-aaaa", "GPU-bbbb"}
    for poll in (slow, still):
        assert poll["seconds"] < 1.4  # the deadline, not the wedged calls (generous)
        assert set(by_uuid(poll)) == {"GPU-aaaa"} and uses(poll, a) == [["GPU-aaaa", GiB, 0.0]]
        assert poll["stale"] == ["GPU-bbbb"] and poll["errors"] == 1
        assert uses(poll, b) == [["GPU-bbbb", None, None]]  # a gap, not a freed GPU
    assert still["seconds"] < 0.5  # the lane is still inside the last call: not asked again
    assert set(by_uuid(back)) == {"GPU-aaaa", "GPU-bbbb"} and back["stale"] == []
    assert sum("did not answer within 0.5 s" in line for line in out["log"]) == 1
    assert any("index 1 answers again" in line for line in out["log"])
    assert out["close_seconds"] < 1.0


@pytest.mark.serial  # times the opening against its 0.5 s deadline (under 1.5 s)
def test_a_gpu_wedged_at_start_does_not_hold_up_the_opening(stub_lib: Path, tmp_path: Path) -> None:
    state = gpus() + "delay * 1000 GPU-bbbb\n"
    out = drive(stub_lib, tmp_path, [{"state": state, "now": time.time()},
                                     {"now": time.time() + 5, "pause": 8.0}], source={"deadline_s": 0.5})
    assert out["open_seconds"] < 1.5
    assert [g[0] for g in out["inventory"]] == ["GPU-aaaa"]
    # Once its listing came back, it is in: listed from the lane, no restart needed.
    assert [g[0] for g in out["polls"][1]["inventory"]] == ["GPU-aaaa", "GPU-bbbb"]


# --- 8: the inventory is read again -----------------------------------------------------------

def test_the_inventory_is_read_again_each_minute(stub_lib: Path, tmp_path: Path) -> None:
    one = gpus().splitlines(keepends=True)[0]
    t = time.time()
    out = drive(stub_lib, tmp_path, [
        {"state": one, "now": t, "mono": 1000.0},
        {"state": gpus(), "now": t + 5, "mono": 1005.0},   # a GPU back on the bus: not yet listed
        {"state": gpus(), "now": t + 65, "mono": 1065.0},  # a minute on
    ], source={"inventory_every_s": 60.0})
    assert [g[0] for g in out["inventory"]] == ["GPU-aaaa"]
    assert [[g[0] for g in p["inventory"]] for p in out["polls"]] == [["GPU-aaaa"], ["GPU-aaaa"],
                                                                       ["GPU-aaaa", "GPU-bbbb"]]
    assert set(by_uuid(out["polls"][2])) == {"GPU-aaaa", "GPU-bbbb"}


def test_a_mig_slot_reused_by_a_new_instance_reports_under_its_own_uuid(
        stub_lib: Path, tmp_path: Path, live_pids: list[int]) -> None:
    pid = live_pids[0]
    parent = f"gpu GPU-mig0 total={40 * GiB} mig=1 name=NVIDIA A100-SXM4-40GB\n"
    old = parent + (f"mig GPU-mig0 0 MIG-old0 total={20 * GiB} used={5 * GiB} name=NVIDIA A100-SXM4-40GB MIG 3g.20gb\n"
                    f"proc MIG-old0 {pid} {4 * GiB}\n")
    new = parent + (f"mig GPU-mig0 0 MIG-new0 total={10 * GiB} used={GiB} name=NVIDIA A100-SXM4-40GB MIG 2g.10gb\n"
                    f"proc MIG-new0 {pid} {GiB // 2}\n")
    t = time.time()
    out = drive(stub_lib, tmp_path, [{"state": old, "now": t}, {"state": new, "now": t + 5}])
    first, second = out["polls"]
    assert uses(first, pid) == [["MIG-old0", 4 * GiB, None]]
    # The handle of slot 0 now names another instance: listed again, read under its UUID.
    assert by_uuid(second) == {"MIG-new0": ["MIG-new0", None, GiB, 10 * GiB, None]}
    assert uses(second, pid) == [["MIG-new0", GiB // 2, None]]
    assert second["inventory"] == [["MIG-new0", 0, "NVIDIA A100-SXM4-40GB MIG 2g.10gb", 10 * GiB]]


# --- the stand-in's health functions (for the health issue), through the real pynvml ---------

HEALTH = r"""
import json, pynvml as nv
nv.nvmlInit()
h = nv.nvmlDeviceGetHandleByIndex(0)
out = {"temp": nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
       "reasons": nv.nvmlDeviceGetCurrentClocksEventReasons(h),
       "ecc": [nv.nvmlDeviceGetTotalEccErrors(h, e, c) for e in (0, 1) for c in (0, 1)],
       "remapped": list(nv.nvmlDeviceGetRemappedRows(h)),
       "supported": nv.nvmlDeviceGetSupportedEventTypes(h)}
events = nv.nvmlEventSetCreate()
nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError | nv.nvmlEventTypeDoubleBitEccError, events)
got = []
for _ in range(3):
    try:
        e = nv.nvmlEventSetWait(events, 100)
        got.append([e.eventType, e.eventData, nv.nvmlDeviceGetUUID(e.device)])
    except nv.NVMLError_Timeout:
        got.append("timeout")
out["events"] = got
nv.nvmlEventSetFree(events)
nv.nvmlShutdown()
print(json.dumps(out))
"""


def test_the_stand_in_serves_health_counters_and_events(stub_lib: Path, tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from tests.fakes.nvml_stub import child_env, write_state

    state = tmp_path / "nvml-state.txt"
    write_state(state, gpus().replace("util=75", "util=75 temp=83 throttle=0x20") + (
        "ecc GPU-aaaa corrected_volatile=5 uncorrected_volatile=1 corrected_aggregate=50 uncorrected_aggregate=2\n"
        "remapped GPU-aaaa corrected=3 uncorrected=1 pending=1 failure=0\n"
        "event GPU-aaaa 0x8 79\n"       # Xid 79: fallen off the bus
        "event GPU-bbbb 0x8 48\n"       # another GPU, not registered
        "event GPU-aaaa 0x2 0\n"))      # a double-bit ECC error
    out = subprocess.run([sys.executable, "-c", HEALTH], env=child_env(stub_lib, state), capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got == {"temp": 83, "reasons": 0x20, "ecc": [5, 50, 1, 2], "remapped": [3, 1, 1, 0],
                   "supported": 0x1F, "events": [[8, 79, "GPU-aaaa"], [2, 0, "GPU-aaaa"], "timeout"]}


# --- the board's serial -----------------------------------------------------------------------

def test_the_serial_is_read_once_with_the_inventory_and_none_where_nvml_gives_none(stub_lib: Path,
                                                                                   tmp_path: Path) -> None:
    # GPU-aaaa a data-center board with a serial; GPU-bbbb answers NOT_SUPPORTED, as consumer GPUs do
    state = gpus().replace("power=312500 ", "power=312500 serial=1320221012345 ")
    mig = (f"gpu GPU-mig0 total={40 * GiB} mig=1 serial=1565020000042 name=NVIDIA A100-SXM4-40GB\n"
           f"mig GPU-mig0 0 MIG-a total={20 * GiB} name=NVIDIA A100-SXM4-40GB MIG 3g.20gb\n")
    t = time.time()
    out = drive(stub_lib, tmp_path, [{"state": state + mig, "now": t}, {"state": state + mig, "now": t + 5}],
                calls=True)
    # a MIG instance carries its board's serial (its parent's): the collector keeps the whole GPU's findings by it
    assert out["serials"] == {"GPU-aaaa": "1320221012345", "GPU-bbbb": "", "MIG-a": "1565020000042"}
    # once a GPU, with the inventory, not at every poll
    assert sorted(u for f, u in out["calls"] if f == "nvmlDeviceGetSerial") == ["GPU-aaaa", "GPU-bbbb", "GPU-mig0"]
