"""The GPU's total-energy counter (nvmlDeviceGetTotalEnergyConsumption: millijoules since the driver loaded),
read at every poll through the real pynvml against the C stand-in: its value as the driver gives it (the
collector takes differences, and says a reset), none for a MIG instance (the counter is the whole GPU's) and
none, asked once, for a GPU that has no counter."""
from __future__ import annotations

import time
from pathlib import Path

from clusterwatch.agent.backends.nvml import NvmlGpuSource

from tests.fakes import fake_pynvml
from tests.fakes.nvml_stub import drive, fixtures

stub_lib = fixtures.stub_lib

GiB = 1024**3


def _calls(out: dict, fn: str) -> list[str]:
    return [uuid for name, uuid in out["calls"] if name == fn]


def test_the_counter_is_read_each_poll_and_a_driver_reload_reads_as_the_driver_gives_it(
        stub_lib: Path, tmp_path: Path) -> None:
    def state(mj: int) -> str:
        return (f"gpu GPU-e0 total={80 * GiB} util=90 power=650000 energy={mj} name=NVIDIA H100\n"
                f"gpu GPU-old total={16 * GiB} util=10 name=Tesla P100\n")  # before Volta: no counter
    t = time.time()
    out = drive(stub_lib, tmp_path, [{"state": state(5_000_000_000), "now": t},
                                     {"state": state(5_000_650_000), "now": t + 1},
                                     {"state": state(1_200), "now": t + 2}],  # the driver was reloaded
                calls=True)
    assert [p["energy"] for p in out["polls"]] == [
        {"GPU-e0": 5_000_000_000, "GPU-old": None},
        {"GPU-e0": 5_000_650_000, "GPU-old": None},
        {"GPU-e0": 1_200, "GPU-old": None}]
    assert all(p["errors"] == 0 for p in out["polls"])
    asked = _calls(out, "nvmlDeviceGetTotalEnergyConsumption")
    assert asked.count("GPU-e0") == 3 and asked.count("GPU-old") == 1  # NOT_SUPPORTED: not asked again


def test_a_mig_instance_sends_no_energy_and_is_never_asked(stub_lib: Path, tmp_path: Path) -> None:
    state = (f"gpu GPU-m total={40 * GiB} mig=1 energy=777 name=NVIDIA A100-SXM4-40GB\n"
             f"mig GPU-m 0 MIG-a total={20 * GiB} name=NVIDIA A100-SXM4-40GB MIG 3g.20gb\n")
    t = time.time()
    out = drive(stub_lib, tmp_path, [{"state": state, "now": t}, {"state": state, "now": t + 1}], calls=True)
    assert [p["energy"] for p in out["polls"]] == [{"MIG-a": None}, {"MIG-a": None}]
    assert _calls(out, "nvmlDeviceGetTotalEnergyConsumption") == []


def test_bindings_without_the_function_read_no_energy_and_go_on() -> None:
    nv = fake_pynvml.FakeNvml([fake_pynvml.FakeGpu("GPU-f", utilization=50)])
    assert not hasattr(nv, "nvmlDeviceGetTotalEnergyConsumption")
    src = NvmlGpuSource(nv)
    try:
        first, second = src.poll(time.time()), src.poll(time.time() + 1)
    finally:
        src.close()
    assert [r.energy_mj for r in first.readings + second.readings] == [None, None]
    assert first.errors == second.errors == 0 and first.readings[0].utilization == 50.0
