"""The health engine over the stream's records: duplicates dropped, the decisions as alert events."""
from __future__ import annotations

from clusterwatch.collector.health.decisions import GpuUser, ThrottleRule
from clusterwatch.collector.health.engine import HealthEngine
from clusterwatch.collector.health.xid_catalog import load_catalog
from clusterwatch.v1 import agent_pb2

KMSG, NVML = agent_pb2.HealthEvent.KMSG, agent_pb2.HealthEvent.NVML
RANKS = [GpuUser("77", rank=0, pid=100, process="python", start_time=5.0),
         GpuUser("77", rank=1, pid=101, process="python", start_time=6.0)]


def xid(n: int, t: float, *, source=KMSG, seq: int = 0, pid: int | None = None, uuid: str = "GPU-a",
        boot: str = "b1") -> agent_pb2.HealthEvent:
    e = agent_pb2.HealthEvent(time=t, uuid=uuid, kind="xid", xid=n, data=n, source=source)
    if source == KMSG:
        e.kernel_boot_id, e.kmsg_seq, e.pci = boot, seq, "0000:3b:00"
    if pid is not None:
        e.pid, e.process = pid, "python"
    return e


def test_xid_79_raises_gpu_lost_naming_the_job_and_rank() -> None:
    eng = HealthEngine(load_catalog())
    [ev] = eng.observe_event("n1", xid(79, 100.0, seq=1), RANKS[:1])
    assert (ev.rule, ev.state, ev.severity, ev.job_id, ev.rank, ev.gpu, ev.pid) == (
        "gpu_lost", "firing", "critical", "77", 0, "GPU-a", -1)
    assert "job 77 rank 0" in ev.description and ev.figures["action"] == "drain"
    [(t, f)] = eng.findings([("n1", "GPU-a")])
    assert t == 100.0 and f.rule == "gpu_lost"


def test_an_application_xid_names_the_process_its_job_and_rank() -> None:
    eng = HealthEngine(load_catalog())
    [ev] = eng.observe_event("n1", xid(13, 100.0, seq=1, pid=101), RANKS)
    assert (ev.rule, ev.severity, ev.job_id, ev.rank, ev.pid, ev.start_time) == ("gpu_xid", "warning", "77", 1,
                                                                                101, 6.0)
    assert "pid 101" in ev.description and ev.figures["xid"] == "13"


def test_a_restarted_agents_reread_of_the_kernel_log_is_dropped() -> None:
    eng = HealthEngine(load_catalog())
    assert eng.observe_event("n1", xid(48, 100.0, seq=7), RANKS)
    assert eng.observe_event("n1", xid(48, 100.0, seq=7), RANKS) == []          # the same record again
    assert eng.observe_event("n1", xid(13, 500.0, seq=8, pid=100), RANKS)      # the next one
    assert eng.observe_event("n1", xid(48, 900.0, seq=2, boot="b2"), RANKS)    # a new boot counts afresh
    assert eng.duplicates == 1


def test_one_xid_from_nvml_and_the_kernel_log_is_one_alert_keeping_the_pid() -> None:
    eng = HealthEngine(load_catalog())
    first = eng.observe_event("n1", xid(13, 100.0, source=NVML), RANKS)
    again = eng.observe_event("n1", xid(13, 100.4, seq=3, pid=100), RANKS)     # names the process: kept
    third = eng.observe_event("n1", xid(13, 101.0, source=NVML), RANKS)        # the same, nothing new
    assert len(first) == 1 and len(again) == 1 and third == []
    assert again[0].pid == 100
    assert eng.observe_event("n1", xid(13, 200.0, source=NVML), RANKS)         # later: a new one


def test_counters_raise_memory_errors_once_and_throttling_of_a_used_gpu() -> None:
    eng = HealthEngine(load_catalog(), throttle=ThrottleRule(window_s=60.0, min_share=0.5))
    calm = agent_pb2.GpuHealth(time=0.0, uuid="GPU-a", ecc_uncorrected_volatile=0, clock_event_reasons=0)
    assert eng.observe_counters("n1", calm, RANKS) == []
    out = []
    for t in range(10, 200, 10):
        h = agent_pb2.GpuHealth(time=float(t), uuid="GPU-a", ecc_uncorrected_volatile=2 if t >= 50 else 0,
                                clock_event_reasons=0x40)
        out += eng.observe_counters("n1", h, RANKS)
    assert [e.rule for e in out] == ["gpu_memory_errors", "gpu_throttle"]
    assert out[0].severity == "critical" and "2 uncorrected ECC errors" in out[0].description
    assert out[1].job_id == "77" and "hardware thermal slowdown" in out[1].description
    assert eng.gpus[("n1", "GPU-a")].counters.ecc_uncorrected_volatile == 2


def test_a_double_bit_ecc_event_raises_memory_errors() -> None:
    eng = HealthEngine(load_catalog())
    e = agent_pb2.HealthEvent(time=5.0, uuid="GPU-a", kind="ecc_double_bit", source=NVML)
    [ev] = eng.observe_event("n1", e, RANKS)
    assert ev.rule == "gpu_memory_errors" and ev.severity == "critical"


def test_a_kernel_log_xid_of_an_unknown_bus_address_names_the_address() -> None:
    eng = HealthEngine(load_catalog())
    e = xid(48, 5.0, seq=1, uuid="")
    [ev] = eng.observe_event("n1", e, [])
    assert ev.gpu == "PCI:0000:3b:00" and ev.job_id == ""


def test_one_loss_is_one_gpu_lost_until_the_gpu_answers_again() -> None:
    eng = HealthEngine(load_catalog())
    nvml_lost = agent_pb2.HealthEvent(time=101.0, uuid="GPU-a", kind="gpu_lost", source=NVML)
    assert [e.rule for e in eng.observe_event("n1", xid(79, 100.0, seq=1), RANKS)] == ["gpu_lost"]
    assert eng.observe_event("n1", nvml_lost, RANKS) == []           # the same loss, seen by NVML
    eng.observe_counters("n1", agent_pb2.GpuHealth(time=500.0, uuid="GPU-a"), RANKS)   # back after a reset
    nvml_lost.time = 900.0
    [ev] = eng.observe_event("n1", nvml_lost, RANKS)
    assert "NVML: GPU is lost" in ev.description and ev.figures["cause"] == "nvml"


def test_an_application_xid_of_no_jobs_process_is_kept_not_raised() -> None:
    eng = HealthEngine(load_catalog())
    assert eng.observe_event("n1", xid(13, 100.0, seq=1, pid=999), []) == []     # read at start, long gone
    [(t, f)] = eng.findings([("n1", "GPU-a")])
    assert f.rule == "gpu_xid" and "pid 999" in f.description
    assert [e.rule for e in eng.observe_event("n1", xid(48, 101.0, seq=2), [])] == ["gpu_xid"]   # hardware: raised


def test_the_latest_counters_are_a_copy_not_a_view_into_the_batch() -> None:
    # A message taken from a batch (upb) holds the whole batch's memory while it is held: one a GPU would
    # keep every node's last batch alive.
    engine = HealthEngine(load_catalog())
    batch = agent_pb2.Batch()
    batch.gpu_health.add(time=1.0, uuid="GPU-a", temperature_c=40)
    engine.observe_counters("n1", batch.gpu_health[0], [])
    batch.gpu_health[0].temperature_c = 99
    assert engine.view("n1", "GPU-a").counters.temperature_c == 40


def links(t: float, pcie: int | None = None, **nvlink: int) -> agent_pb2.GpuHealth:
    h = agent_pb2.GpuHealth(time=t, uuid="GPU-a")
    if pcie is not None:
        h.pcie_replays = pcie
    for counter, n in nvlink.items():
        h.nvlink_errors[counter] = n
    return h


def test_a_degraded_link_raises_gpu_link_errors_once_naming_the_straggler() -> None:
    eng = HealthEngine(load_catalog())
    assert eng.observe_counters("n1", links(100.0, pcie=5000, replay=7, recovery=0, crc_flit=10), RANKS[1:]) == []
    assert eng.observe_counters("n1", links(130.0, pcie=5003, replay=8, recovery=0, crc_flit=900), RANKS[1:]) == []
    [ev] = eng.observe_counters("n1", links(160.0, pcie=5003, replay=8, recovery=3, crc_flit=900), RANKS[1:])
    assert (ev.rule, ev.severity, ev.job_id, ev.rank, ev.gpu) == ("gpu_link_errors", "warning", "77", 1, "GPU-a")
    assert "3 NVLink replay and recovery errors in 30 s" in ev.description and "straggler" in ev.description
    # still degraded: said once; then a quiet reading, and the next rise is said again
    assert eng.observe_counters("n1", links(190.0, pcie=5400, replay=8, recovery=3, crc_flit=900), RANKS) == []
    assert eng.observe_counters("n1", links(220.0, pcie=5400, replay=8, recovery=3, crc_flit=900), RANKS) == []
    [again] = eng.observe_counters("n1", links(250.0, pcie=5400, replay=8, recovery=3, crc_flit=10**6), RANKS)
    assert "NVLink CRC errors" in again.description
    [(_, standing)] = [tf for tf in eng.findings([("n1", "GPU-a")], since=1e9, standing=True)]
    assert standing.rule == "gpu_link_errors"   # a job starting now is told


def test_pcie_replays_past_8_a_minute_are_a_degraded_link_and_a_reset_counter_none() -> None:
    eng = HealthEngine(load_catalog())
    eng.observe_counters("n1", links(0.0, pcie=100), RANKS)
    assert eng.observe_counters("n1", links(60.0, pcie=108), RANKS) == []     # 8 a minute: the limit
    [ev] = eng.observe_counters("n1", links(120.0, pcie=117), RANKS)
    assert "9 PCIe replays in 60 s" in ev.description
    fresh = HealthEngine(load_catalog())
    fresh.observe_counters("n1", links(0.0, pcie=10**6, replay=50), RANKS)
    assert fresh.observe_counters("n1", links(30.0, pcie=0, replay=0), RANKS) == []   # a reset, not errors
    assert fresh.observe_counters("n1", links(30.0, pcie=10**6), RANKS) == []         # no time between: nothing


def test_an_nvlink_down_is_a_critical_gpu_link_errors_naming_the_link() -> None:
    eng = HealthEngine(load_catalog())
    e = agent_pb2.HealthEvent(time=7.0, uuid="GPU-a", kind="nvlink_down", data=2, source=NVML)
    [ev] = eng.observe_event("n1", e, RANKS[:1])
    assert (ev.rule, ev.severity, ev.job_id, ev.figures["nvlink"]) == ("gpu_link_errors", "critical", "77", "2")
    assert "NVLink 2 is down" in ev.description
    [(t, f)] = eng.findings([("n1", "GPU-a")])
    assert t == 7.0 and f.rule == "gpu_link_errors"
    up = agent_pb2.HealthEvent(time=8.0, uuid="GPU-a", kind="nvlink_up", data=2, source=NVML)
    assert eng.observe_event("n1", up, RANKS[:1]) == []
