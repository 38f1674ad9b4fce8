"""The GPUs' true activity (GPM) through the real pynvml bindings, against the C stand-in for the driver library.

The NVML source reads GPM on a thread of its own (agent/backends/nvml_gpm.py); the cases run it in a
child process over the stand-in (tests/fakes/nvml_stub), with a short cadence, and look at what the polls
carried. No GPU is needed or used.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.fakes.nvml_stub import child_env, drive, fixtures, write_state

stub_lib = fixtures.stub_lib

GiB = 1024**3
MiB = 1024**2
HOPPER = f"gpu GPU-hopper total={80 * GiB} used={GiB} util=100 name=NVIDIA H100 80GB HBM3\n"
AMPERE = f"gpu GPU-ampere total={80 * GiB} used={GiB} util=100 name=NVIDIA A100-SXM4-80GB\n"
# a collective spinning: utilisation 100 %, SMs and tensor cores almost idle
SPINNING = "gpm GPU-hopper sm=3 occupancy=1.5 tensor=0 dram=2 pcie_tx=10 pcie_rx=20 nvlink_tx=300 nvlink_rx=400\n"
STEPS = 8  # polls half a second apart: the reader, every 0.2 s, has read many times by the last


def run(stub_lib: Path, tmp_path: Path, state: str, every_s: float = 0.2, calls: bool = False) -> dict:
    steps = [{"state": state}] + [{"pause": 0.5} for _ in range(STEPS - 1)]
    return drive(stub_lib, tmp_path, steps, source={"activity_every_s": every_s}, calls=calls)


def activity(result: dict) -> dict[str, list[dict]]:
    """UUID → every activity the polls carried, in order."""
    out: dict[str, list[dict]] = {}
    for poll in result["polls"]:
        for uuid, got in poll["activity"].items():
            out.setdefault(uuid, []).append(got)
    return out


def test_a_hopper_gpu_reads_its_activity_and_an_older_one_says_once_it_has_none(stub_lib: Path,
                                                                                 tmp_path: Path) -> None:
    result = run(stub_lib, tmp_path, HOPPER + AMPERE + SPINNING)
    got = activity(result)
    assert set(got) == {"GPU-hopper"}, "a GPU without GPM carries no activity"
    last = got["GPU-hopper"][-1]
    assert last["sm_active"] == 3.0 and last["sm_occupancy"] == 1.5 and last["tensor_active"] == 0.0
    assert last["dram_active"] == 2.0
    assert last["pcie_tx_bytes_per_s"] == 10 * MiB and last["pcie_rx_bytes_per_s"] == 20 * MiB
    assert last["nvlink_tx_bytes_per_s"] == 300 * MiB and last["nvlink_rx_bytes_per_s"] == 400 * MiB
    assert last["window_s"] > 0
    # utilisation still says 100 %: the readings the GPUs have are kept, the Ampere one's included
    for poll in result["polls"]:
        assert {r[0]: r[1] for r in poll["readings"]} == {"GPU-hopper": 100.0, "GPU-ampere": 100.0}
    said = [line for line in result["log"] if "GPM" in line]
    assert len(said) == 1 and "GPU-ampere" in said[0] and "GPU-hopper" not in said[0], result["log"]


def test_a_metric_the_gpu_does_not_offer_is_none_and_the_others_stand(stub_lib: Path, tmp_path: Path) -> None:
    # a PCIe card: no NVLink
    result = run(stub_lib, tmp_path, HOPPER + "gpm GPU-hopper sm=80 occupancy=40 tensor=65 dram=55 pcie_tx=1\n")
    last = activity(result)["GPU-hopper"][-1]
    assert (last["sm_active"], last["tensor_active"], last["dram_active"]) == (80.0, 65.0, 55.0)
    assert last["nvlink_tx_bytes_per_s"] is None and last["nvlink_rx_bytes_per_s"] is None
    assert last["pcie_rx_bytes_per_s"] is None and last["pcie_tx_bytes_per_s"] == MiB
    assert not [line for line in result["log"] if "GPM" in line]


def test_mig_instances_are_read_through_their_parent_under_their_own_uuid(stub_lib: Path, tmp_path: Path) -> None:
    state = (f"gpu GPU-parent total={80 * GiB} mig=1 name=NVIDIA H100 80GB HBM3\n"
             f"mig GPU-parent 0 MIG-one total={10 * GiB} gi=1 name=NVIDIA H100 1g.10gb\n"
             f"mig GPU-parent 1 MIG-two total={10 * GiB} gi=2 name=NVIDIA H100 1g.10gb\n"
             "gpm GPU-parent\ngpm MIG-one sm=70 tensor=50\ngpm MIG-two sm=5 tensor=0\n")
    result = run(stub_lib, tmp_path, state, calls=True)
    got = activity(result)
    assert set(got) == {"MIG-one", "MIG-two"}
    assert (got["MIG-one"][-1]["sm_active"], got["MIG-one"][-1]["tensor_active"]) == (70.0, 50.0)
    assert (got["MIG-two"][-1]["sm_active"], got["MIG-two"][-1]["tensor_active"]) == (5.0, 0.0)
    functions = {fn for fn, _uuid in result["calls"]}
    assert "nvmlGpmMigSampleGet" in functions and "nvmlGpmSampleGet" not in functions


def test_a_cadence_of_zero_makes_no_gpm_call(stub_lib: Path, tmp_path: Path) -> None:
    result = run(stub_lib, tmp_path, HOPPER + SPINNING, every_s=0, calls=True)
    assert not activity(result)
    assert not [fn for fn, _uuid in result["calls"] if fn.startswith("nvmlGpm")]


def test_a_failing_gpm_read_is_counted_and_the_reading_comes_back(stub_lib: Path, tmp_path: Path) -> None:
    failing = HOPPER + SPINNING + "fail nvmlGpmMetricsGet 999\n"
    steps = [{"state": failing}] + [{"pause": 0.5} for _ in range(3)]
    steps += [{"state": HOPPER + SPINNING}] + [{"pause": 0.5} for _ in range(STEPS)]
    result = drive(stub_lib, tmp_path, steps, source={"activity_every_s": 0.2})
    assert sum(poll["errors"] for poll in result["polls"][:4]) >= 1
    assert not any(poll["activity"] for poll in result["polls"][:4])
    assert activity(result)["GPU-hopper"][-1]["sm_active"] == 3.0


RAW = """
import sys, time, pynvml as nv
nv.nvmlInit()
a, b = nv.nvmlDeviceGetHandleByIndex(0), nv.nvmlDeviceGetHandleByIndex(1)
s1, s2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
get = nv.c_nvmlGpmMetricsGet_t()
get.version, get.numMetrics = nv.NVML_GPM_METRICS_GET_VERSION, 1
get.metrics[0].metricId = nv.NVML_GPM_METRIC_SM_UTIL
def code(fn, *args):
    try:
        fn(*args)
        return 0
    except nv.NVMLError as exc:
        return exc.value
out = [nv.nvmlGpmQueryDeviceSupport(a).isSupportedDevice, nv.nvmlGpmQueryDeviceSupport(b).isSupportedDevice,
       code(nv.nvmlGpmSampleGet, b, s1)]
nv.nvmlGpmSampleGet(a, s1)
time.sleep(0.01)
nv.nvmlGpmSampleGet(a, s2)
get.sample1, get.sample2 = s2, s1
out.append(code(nv.nvmlGpmMetricsGet, get))          # samples the wrong way round
get.sample1, get.sample2 = s1, s2
get.version = 2
out.append(code(nv.nvmlGpmMetricsGet, get))          # a struct version the library does not know
get.version = 1
nv.nvmlGpmMetricsGet(get)
out += [get.metrics[0].nvmlReturn, get.metrics[0].value]
nv.nvmlGpmSampleFree(s1); nv.nvmlGpmSampleFree(s2)
print(out)
"""


def test_the_stand_in_answers_gpm_as_the_driver_does(stub_lib: Path, tmp_path: Path) -> None:
    state = tmp_path / "state.txt"
    write_state(state, HOPPER + AMPERE + "gpm GPU-hopper sm=42\n")
    out = subprocess.run([sys.executable, "-c", RAW], env=child_env(stub_lib, state), capture_output=True,
                         text=True, timeout=60, check=True).stdout
    # supported, not; NOT_SUPPORTED; INVALID_ARGUMENT; ARGUMENT_VERSION_MISMATCH; the metric
    assert out.strip() == "[1, 0, 3, 2, 25, 0, 42.0]"
