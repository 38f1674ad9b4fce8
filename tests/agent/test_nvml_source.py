"""NvmlGpuSource against a fake shaped like the pynvml module, handed to its constructor."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
from clusterwatch.agent.backends.nvml import NvmlGpuSource

from clusterwatch.errors import SourceUnavailable
from clusterwatch.model import GpuInfo, GpuReading, GpuUse
from tests.fakes import fake_pynvml as fk
from tests.fakes.fake_pynvml import FakeGpu, FakeNvml, FakeProcess
from tests.fakes.no_nvml import run_without_nvml

GiB = 1024**3
MiB = 1024**2


def us(t: float) -> int:
    """A CPU timestamp in microseconds, as NVML stamps utilisation samples."""
    return int(t * 1_000_000)


def source(nv: FakeNvml, **kwargs: object) -> NvmlGpuSource:
    """A source over the fake, whose made-up pids all count as live processes of this host."""
    kwargs.setdefault("pid_visible", lambda pid: True)
    kwargs.setdefault("nested_pid_namespace", False)
    return NvmlGpuSource(nv, **kwargs)


def two_gpus() -> list[FakeGpu]:
    return [
        FakeGpu(
            uuid="GPU-aaaa",
            processes=[FakeProcess(101, 3 * GiB), FakeProcess(102, 1 * GiB, kind="both")],
            util_samples=[(101, us(998), 55), (102, us(998), 130), (101, us(999), 60), (999, us(999.5), 90)],
        ),
        FakeGpu(
            uuid="GPU-bbbb", name="NVIDIA A100-SXM4-80GB", memory_used=2 * GiB, utilization=0,
            power_mw=61_250, processes=[FakeProcess(201, 512 * MiB)], util_samples=[(201, us(998.5), 5)],
        ),
    ]


def by_uuid(readings: list[GpuReading]) -> dict[str, GpuReading]:
    return {r.uuid: r for r in readings}


def test_normal_values() -> None:
    nv = FakeNvml(two_gpus())
    src = source(nv)
    assert src.name == "nvml"
    assert src.inventory() == [
        GpuInfo("GPU-aaaa", 0, "NVIDIA H100 80GB HBM3", 80 * GiB),
        GpuInfo("GPU-bbbb", 1, "NVIDIA A100-SXM4-80GB", 80 * GiB),
    ]
    poll = src.poll(1000.0)
    assert poll.errors == 0
    assert by_uuid(poll.readings) == {
        "GPU-aaaa": GpuReading("GPU-aaaa", 75.0, 10 * GiB, 80 * GiB, 312.5),
        "GPU-bbbb": GpuReading("GPU-bbbb", 0.0, 2 * GiB, 80 * GiB, 61.25),
    }
    # pid 101: the newest of its samples; pid 102 is listed as compute and graphics but
    # counted once, its out-of-range 130 clamped; pid 999 is not in the process list.
    assert poll.processes == {
        101: [GpuUse("GPU-aaaa", 3 * GiB, 60.0)],
        102: [GpuUse("GPU-aaaa", 1 * GiB, 100.0)],
        201: [GpuUse("GPU-bbbb", 512 * MiB, 5.0)],
    }
    src.close()
    src.close()
    assert nv.count("nvmlShutdown") == 1
    assert nv.initialized == 0


def test_one_process_on_two_gpus() -> None:
    gpus = two_gpus()
    gpus[1].processes.append(FakeProcess(101, 7 * GiB))
    poll = source(FakeNvml(gpus)).poll(1000.0)
    # No sample for 101 on GPU-bbbb, whose query answered: idle there, 0 %.
    assert poll.processes[101] == [GpuUse("GPU-aaaa", 3 * GiB, 60.0), GpuUse("GPU-bbbb", 7 * GiB, 0.0)]


def test_not_supported_fields_are_none_and_not_asked_again() -> None:
    gpus = two_gpus()
    gpus[0].fail["nvmlDeviceGetPowerUsage"] = fk.NVMLError_NotSupported()
    gpus[0].fail["nvmlDeviceGetUtilizationRates"] = fk.NVMLError(4)  # NoPermission, via the code
    gpus[0].fail["nvmlDeviceGetProcessUtilization"] = fk.NVMLError_NotSupported()
    nv = FakeNvml(gpus)
    src = source(nv)
    for now in (1000.0, 1005.0, 1010.0):
        poll = src.poll(now)
        assert poll.errors == 0
        assert by_uuid(poll.readings)["GPU-aaaa"] == GpuReading("GPU-aaaa", None, 10 * GiB, 80 * GiB, None)
        assert poll.processes[101] == [GpuUse("GPU-aaaa", 3 * GiB, None)]
        assert by_uuid(poll.readings)["GPU-bbbb"].power_watts == 61.25
    for fn in ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetProcessUtilization"):
        assert nv.count(fn, "GPU-aaaa") == 1, fn
    assert nv.count("nvmlDeviceGetPowerUsage", "GPU-bbbb") == 3


def test_transient_error_is_counted_and_the_field_is_none() -> None:
    gpus = two_gpus()
    src = source(FakeNvml(gpus))
    gpus[1].fail["nvmlDeviceGetMemoryInfo"] = fk.NVMLError_Timeout()
    poll = src.poll(1000.0)
    assert poll.errors == 1
    assert by_uuid(poll.readings)["GPU-bbbb"] == GpuReading("GPU-bbbb", 0.0, None, None, 61.25)
    gpus[1].fail.clear()
    poll = src.poll(1005.0)  # a transient error is retried
    assert poll.errors == 0
    assert by_uuid(poll.readings)["GPU-bbbb"].memory_used_bytes == 2 * GiB


def test_no_processes() -> None:
    gpus = [FakeGpu(uuid="GPU-idle")]
    nv = FakeNvml(gpus)
    poll = source(nv).poll(1000.0)
    assert poll.errors == 0
    assert poll.processes == {}
    assert poll.readings == [GpuReading("GPU-idle", 75.0, 10 * GiB, 80 * GiB, 312.5)]
    # No process listed: process utilisation is not asked for at all.
    assert nv.count("nvmlDeviceGetProcessUtilization") == 0


def test_process_utilization_bare_error_zero_means_no_samples() -> None:
    # A process holds memory but the driver has no utilisation sample at all: pynvml
    # raises a bare NVMLError whose value is 0 (NVML_SUCCESS from the size query).
    gpus = [FakeGpu(uuid="GPU-aaaa", processes=[FakeProcess(101, GiB)])]
    nv = FakeNvml(gpus)
    src = source(nv)
    with pytest.raises(fk.NVMLError) as info:
        nv.nvmlDeviceGetProcessUtilization(nv.nvmlDeviceGetHandleByIndex(0), 0)
    assert type(info.value) is fk.NVMLError and info.value.value == 0
    poll = src.poll(1000.0)
    assert poll.errors == 0
    # The GPU answered and has no sample for the process: it is idle, not unknown.
    assert poll.processes == {101: [GpuUse("GPU-aaaa", GiB, 0.0)]}


def test_process_utilization_not_found_keeps_last_value_for_a_while() -> None:
    gpus = [FakeGpu(uuid="GPU-aaaa", processes=[FakeProcess(101, GiB)], util_samples=[(101, us(999), 42)])]
    nv = FakeNvml(gpus)
    src = source(nv, util_hold_s=10.0)
    assert src.poll(1000.0).processes[101][0].sm_utilization == 42.0
    # The next query asks only for samples newer than the newest taken (tracked by us).
    poll = src.poll(1004.0)  # NotFound: nothing newer
    assert ("lastSeenTimeStamp", str(us(999))) in nv.calls
    assert poll.errors == 0
    assert poll.processes[101][0].sm_utilization == 42.0
    # Past the hold with no sample while the GPU answers: the process is idle.
    assert src.poll(1011.0).processes[101][0].sm_utilization == 0.0
    gpus[0].util_samples.append((101, us(1014), 17))
    assert src.poll(1015.0).processes[101][0].sm_utilization == 17.0


def test_a_lost_gpu_is_a_gap_and_the_others_are_still_read(caplog: pytest.LogCaptureFixture) -> None:
    gpus = two_gpus()
    nv = FakeNvml(gpus)
    src = source(nv, log=logging.getLogger("test.nvml"))
    gpus[0].lost = True
    with caplog.at_level(logging.WARNING, logger="test.nvml"):
        for now in (1000.0, 1005.0, 1010.0):
            poll = src.poll(now)
            assert poll.errors == 1
            # No reading at all (not an empty one), and marked stale: not a freed GPU.
            assert by_uuid(poll.readings) == {"GPU-bbbb": GpuReading("GPU-bbbb", 0.0, 2 * GiB, 80 * GiB, 61.25)}
            assert poll.stale == ["GPU-aaaa"]
            assert set(poll.processes) == {201}
    # Counted every poll, logged once.
    assert len([r for r in caplog.records if "GPU-aaaa" in r.getMessage()]) == 1
    assert [g.uuid for g in src.inventory()] == ["GPU-aaaa", "GPU-bbbb"]


def test_unknown_error_on_one_call_fails_that_field_only() -> None:
    gpus = two_gpus()
    src = source(FakeNvml(gpus))
    assert set(src.poll(999.5).processes) == {101, 102, 201}
    gpus[1].fail["nvmlDeviceGetComputeRunningProcesses_v3"] = fk.NVMLError_Unknown()
    poll = src.poll(1000.0)
    assert poll.errors == 1
    # The GPU's own readings stand; its processes as last listed, their figures unknown.
    assert by_uuid(poll.readings)["GPU-bbbb"] == GpuReading("GPU-bbbb", 0.0, 2 * GiB, 80 * GiB, 61.25)
    assert by_uuid(poll.readings)["GPU-aaaa"].utilization == 75.0
    assert poll.processes[201] == [GpuUse("GPU-bbbb", None, None)]
    assert poll.stale == []


def test_gpu_lost_before_enumeration_is_left_out_and_counted_once() -> None:
    gpus = two_gpus()
    gpus[1].lost = True
    mono = [0.0]
    src = source(FakeNvml(gpus), clock=lambda: mono[0], inventory_every_s=60.0)
    assert [g.uuid for g in src.inventory()] == ["GPU-aaaa"]
    assert src.poll(1000.0).errors == 1
    assert src.poll(1005.0).errors == 0
    # Tried again once a minute, counted once each time, not at every poll in between.
    mono[0] = 61.0
    assert [src.poll(1060.0 + 5 * i).errors for i in range(3)] == [1, 0, 0]
    gpus[1].lost = False
    mono[0] = 122.0
    poll = src.poll(1125.0)
    assert poll.errors == 0 and [r.uuid for r in poll.readings] == ["GPU-aaaa", "GPU-bbbb"]


def test_library_mismatch_falls_back_to_v2() -> None:
    # Bindings without the _v3 functions and a library without the newest struct: the
    # unversioned wrapper raises NVMLLibraryMismatchError, which is not an NVMLError.
    assert not issubclass(fk.NVMLLibraryMismatchError, fk.NVMLError)
    nv = FakeNvml(two_gpus(), binding_has_v3=False, library_has_v3=False)
    src = source(nv)
    for now in (1000.0, 1005.0):
        poll = src.poll(now)
        assert poll.errors == 0
        assert poll.processes[101] == [GpuUse("GPU-aaaa", 3 * GiB, 60.0)]
        assert poll.processes[102] == [GpuUse("GPU-aaaa", GiB, 100.0)]
    # The unversioned function is tried once per kind, then never again.
    assert nv.count("nvmlDeviceGetComputeRunningProcesses") == 1
    assert nv.count("nvmlDeviceGetGraphicsRunningProcesses") == 1
    assert nv.count("nvmlDeviceGetComputeRunningProcesses_v2") == 4


def test_v3_missing_from_the_library_falls_back_through_the_mismatch() -> None:
    nv = FakeNvml(two_gpus(), binding_has_v3=True, library_has_v3=False)
    poll = source(nv).poll(1000.0)
    assert poll.errors == 0
    assert poll.processes[201] == [GpuUse("GPU-bbbb", 512 * MiB, 5.0)]
    assert nv.count("nvmlDeviceGetComputeRunningProcesses_v3") == 1
    assert nv.count("nvmlDeviceGetComputeRunningProcesses") == 1
    assert nv.count("nvmlDeviceGetComputeRunningProcesses_v2") == 2


NO_LIBRARY = """
import pynvml
from clusterwatch.agent.backends.nvml import NvmlGpuSource
from clusterwatch.errors import SourceUnavailable
try:
    NvmlGpuSource(pynvml)
except SourceUnavailable as exc:
    print(exc)
"""


def test_no_library_with_the_real_pynvml_gives_one_clear_line(tmp_path: Path) -> None:
    # The real module's nvmlInit raises NVMLError_LibraryNotFound in a child whose NVML library cannot be
    # loaded (tests/fakes/no_nvml.py), whether this host has a driver or not.
    out = run_without_nvml(NO_LIBRARY, tmp_path)
    assert out.returncode == 0, out.stderr
    line = out.stdout.removesuffix("\n")
    assert "\n" not in line
    assert line.startswith("NVML library not found (libnvidia-ml.so.1)")
    assert "running without GPU data" in line
    assert "--gpu-source sim" in line


@pytest.mark.parametrize(
    ("code", "start"),
    [
        (12, "NVML library not found"),
        (9, "NVIDIA driver not loaded"),
        (4, "NVML refused access"),
        (18, "NVML library and NVIDIA kernel driver versions differ"),
        (10, "NVML could not start (Timeout)"),
    ],
)
def test_init_errors_give_one_line(code: int, start: str) -> None:
    with pytest.raises(SourceUnavailable) as info:
        source(FakeNvml(two_gpus(), init_error=code))
    assert str(info.value).startswith(start)
    assert "\n" not in str(info.value)


def test_no_gpu_is_unavailable_and_releases_nvml() -> None:
    nv = FakeNvml([])
    with pytest.raises(SourceUnavailable, match="^NVML found no usable GPU on this node"):
        source(nv)
    assert nv.initialized == 0


def test_mig_instances_are_the_devices() -> None:
    mig_a = FakeGpu(
        uuid="MIG-1111", name="NVIDIA A100-SXM4-40GB MIG 3g.20gb", memory_total=20 * GiB, memory_used=5 * GiB,
        processes=[FakeProcess(301, 4 * GiB)], util_samples=[(301, 1_000, 50)],
    )
    mig_b = FakeGpu(uuid="MIG-2222", name="NVIDIA A100-SXM4-40GB MIG 2g.10gb", memory_total=10 * GiB,
                    memory_used=GiB, processes=[])
    parent = FakeGpu(uuid="GPU-mig0", name="NVIDIA A100-SXM4-40GB", mig=[mig_a, None, mig_b])
    plain = FakeGpu(uuid="GPU-plain", processes=[FakeProcess(401, GiB)])
    mig_a.fail["nvmlDeviceGetPowerUsage"] = fk.NVMLError_NotSupported()
    mig_b.fail["nvmlDeviceGetPowerUsage"] = fk.NVMLError_NotSupported()
    nv = FakeNvml([parent, plain])
    src = source(nv)
    assert src.inventory() == [
        # each names its parent: the GPU's health is read on it (the collector applies it to the instances)
        GpuInfo("MIG-1111", 0, "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 20 * GiB, "GPU-mig0"),
        GpuInfo("MIG-2222", 0, "NVIDIA A100-SXM4-40GB MIG 2g.10gb", 10 * GiB, "GPU-mig0"),
        GpuInfo("GPU-plain", 1, "NVIDIA H100 80GB HBM3", 80 * GiB),
    ]
    for now in (1000.0, 1005.0):
        poll = src.poll(now)
        assert poll.errors == 0
        assert by_uuid(poll.readings) == {
            "MIG-1111": GpuReading("MIG-1111", None, 5 * GiB, 20 * GiB, None),
            "MIG-2222": GpuReading("MIG-2222", None, GiB, 10 * GiB, None),
            "GPU-plain": GpuReading("GPU-plain", 75.0, 10 * GiB, 80 * GiB, 312.5),
        }
        assert poll.processes == {
            301: [GpuUse("MIG-1111", 4 * GiB, None)],
            401: [GpuUse("GPU-plain", GiB, 0.0)],
        }
    # Utilisation is documented as unsupported on MIG: never asked of an instance.
    assert nv.count("nvmlDeviceGetUtilizationRates", "MIG-1111") == 0
    assert nv.count("nvmlDeviceGetProcessUtilization", "MIG-1111") == 0
    assert nv.count("nvmlDeviceGetPowerUsage", "MIG-1111") == 1


def test_mig_instances_that_cannot_be_listed_leave_the_parent_in() -> None:
    parent = FakeGpu(uuid="GPU-mig0", name="NVIDIA A100-SXM4-40GB", mig=[FakeGpu(uuid="MIG-1111")])
    parent.fail["nvmlDeviceGetMigDeviceHandleByIndex"] = fk.NVMLError_NoPermission()
    parent.fail["nvmlDeviceGetMemoryInfo"] = fk.NVMLError_NoPermission()  # MIG parent, unprivileged
    src = source(FakeNvml([parent]))
    assert src.inventory() == [GpuInfo("GPU-mig0", 0, "NVIDIA A100-SXM4-40GB", 0)]
    poll = src.poll(1000.0)
    # Utilisation is not supported on a MIG-enabled GPU, memory needs privileges: None, not errors.
    assert poll.errors == 0
    assert poll.readings == [GpuReading("GPU-mig0", None, None, None, 312.5)]


def test_the_agent_takes_the_gpus_listed_again(tmp_path) -> None:
    from clusterwatch.agent.agent import Agent
    from clusterwatch.agent.backends.procs import ProcSource
    from clusterwatch.agent.config import AgentConfig
    from clusterwatch.agent.labels import JobLabeler

    gpus = two_gpus()
    nv = FakeNvml(gpus[:1])
    mono = [0.0]
    agent = Agent(AgentConfig(collector=None, node="n1", spool_dir=str(tmp_path)),
                  source(nv, clock=lambda: mono[0], inventory_every_s=60.0), ProcSource("n1"), JobLabeler({}))
    assert [g.uuid for g in agent.hello().gpus] == ["GPU-aaaa"]
    nv.gpus.append(gpus[1])  # back on the bus
    mono[0] = 61.0
    batch, _ = agent.poll()
    assert [g.uuid for g in batch.gpus] == ["GPU-aaaa", "GPU-bbbb"]
    assert [g.uuid for g in agent.hello().gpus] == ["GPU-aaaa", "GPU-bbbb"]


def test_no_working_process_getter_is_said_once_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    # Bindings without _v2 wrappers (nvidia-ml-py 12.535.x) on a driver without _v3.
    nv = FakeNvml(two_gpus(), binding_has_v3=True, library_has_v3=False)
    for kind in ("Compute", "Graphics"):
        delattr(nv, f"nvmlDeviceGet{kind}RunningProcesses_v2")
    src = source(nv, log=logging.getLogger("test.nvml"))
    with caplog.at_level(logging.WARNING, logger="test.nvml"):
        polls = [src.poll(now) for now in (1000.0, 1005.0)]
    for poll in polls:
        assert poll.processes == {}
        assert poll.errors == 4  # two lists on two GPUs, each poll
    lines = [r.getMessage() for r in caplog.records if "works with this driver" in r.getMessage()]
    assert len(lines) == 2 and "nvmlDeviceGetComputeRunningProcesses" in lines[0]
