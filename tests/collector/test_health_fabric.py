"""The node's fabric in the collector (collector/health/fabric.py): a port that flaps, degrades or climbs in
errors, and an NVSwitch SXID, become findings on the node that name every job there, alerts while a job runs
there, rows of `health` and series of /metrics."""
from __future__ import annotations

from clusterwatch.collector.health.decisions import GpuUser
from clusterwatch.collector.health.engine import HealthEngine
from clusterwatch.collector.health.fabric import FabricRule, PortState, fabric_cause, port_trouble
from clusterwatch.collector.health.metrics import HealthFamilies, health_snapshot
from clusterwatch.collector.health.xid_catalog import load_catalog
from clusterwatch.v1 import agent_pb2

RULE = FabricRule()
USERS = [GpuUser(job_id="77", rank=0, pid=10), GpuUser(job_id="78", rank=0, pid=11)]


def reading(t, state=4, rate=200.0, width=4, speed="HDR", **counters) -> agent_pb2.FabricPort:
    msg = agent_pb2.FabricPort(time=t, device="mlx5_0", port=1, state=state, phys_state=5 if state == 4 else 2,
                               rate_gbps=rate, width=width, speed=speed, link_layer="InfiniBand")
    msg.counters.update(counters)
    return msg


def trouble(before, after, highest=200.0, was_active=True, last_flap=None):
    return port_trouble(RULE, PortState.of(before) if before else None, PortState.of(after), highest_gbps=highest,
                        was_active=was_active, last_flap=last_flap)


def test_port_trouble_table():
    ok = reading(0, link_downed=1, link_error_recovery=0, symbol_error=5)
    assert trouble(ok, reading(30, link_downed=1, symbol_error=6)) == {}
    assert set(trouble(ok, reading(30, link_downed=3, symbol_error=5))) == {"flapping"}
    assert set(trouble(ok, reading(30, link_downed=1, link_error_recovery=2, symbol_error=5))) == {"flapping"}
    assert set(trouble(ok, reading(30, state=1, link_downed=2, symbol_error=5))) == {"down", "flapping"}
    assert trouble(None, reading(0, state=1), was_active=False) == {}       # an unused port: no trouble
    assert set(trouble(ok, reading(30, rate=100.0, width=2, link_downed=1, symbol_error=5))) == {"degraded"}
    # below what its width and speed give, though never seen faster
    assert "degraded" in trouble(None, reading(0, rate=100.0, width=4), highest=None)
    assert set(trouble(ok, reading(30, link_downed=1, symbol_error=500))) == {"errors"}
    assert trouble(ok, reading(30, link_downed=0, symbol_error=0)) == {}    # counters reset: nothing said
    assert set(trouble(ok, reading(300, link_downed=1, symbol_error=5), last_flap=0.0)) == {"flapping"}
    assert trouble(ok, reading(900, link_downed=1, symbol_error=5), last_flap=0.0) == {}


def test_a_flapping_port_is_a_finding_on_its_node_an_alert_for_its_job_and_a_series():
    engine = HealthEngine(load_catalog())
    assert engine.observe_port("n1", reading(0, link_downed=0), USERS) == []
    [alert] = engine.observe_port("n1", reading(30, link_downed=2), USERS)
    assert (alert.rule, alert.node, alert.job_id, alert.severity) == ("fabric_port", "n1", "77", "warning")
    assert "port mlx5_0/1 of n1: flapping: went down 2 times" in alert.description
    assert "job 77, job 78" in alert.description
    assert engine.observe_port("n1", reading(60, link_downed=2), USERS) == []     # still flapping: said once
    [(t, f)] = engine.fabric.node_findings(["n1"], standing=True)
    assert (t, f.uuid) == (30.0, "mlx5_0/1")
    cause = fabric_cause(t, f, 90.0)
    assert cause.kind == "fabric" and cause.figures["cause_port"] == "mlx5_0/1", cause
    assert cause.text.startswith("fabric port mlx5_0/1 on n1, 1 min before: InfiniBand port"), cause.text
    families = HealthFamilies(lambda: health_snapshot(engine, type("S", (), {"gpus": {}})()))
    rows = {fam.name: r for fam, r in families.series(families.snapshot())}
    assert (("node", "port", "kind"), ("n1", "mlx5_0/1", "flapping"), 1) in rows["clusterwatch_fabric_port_trouble"]
    errors = rows["clusterwatch_fabric_port_errors"]
    assert (("node", "port", "counter"), ("n1", "mlx5_0/1", "link_downed"), 2) in errors
    assert (("node", "port"), ("n1", "mlx5_0/1"), 25e9) in rows["clusterwatch_fabric_port_rate_bytes_per_second"]


def test_a_port_trouble_on_an_idle_node_is_kept_not_raised():
    engine = HealthEngine(load_catalog())
    engine.observe_port("n2", reading(0), [])
    assert engine.observe_port("n2", reading(30, rate=100.0, width=2), []) == []
    [(_, f)] = engine.fabric.node_findings(["n2"])
    assert "below the 200 Gb/s it ran at" in f.description


def test_an_sxid_is_a_finding_on_its_node_once_per_record():
    engine = HealthEngine(load_catalog())
    msg = agent_pb2.HealthEvent(time=5.0, kind="sxid", sxid=20034, fatal=True, device="nvidia-nvswitch1",
                                pci="0000:06:00.0", text="Link 48 LTSSM Fault Up", source=agent_pb2.HealthEvent.KMSG,
                                kernel_boot_id="b1", kmsg_seq=9)
    [alert] = engine.observe_event("n1", msg, USERS)
    assert (alert.rule, alert.severity, alert.job_id) == ("nvswitch_sxid", "critical", "77")
    assert "SXID 20034 (Fatal) on NVSwitch nvidia-nvswitch1 (PCI:0000:06:00.0) of n1" in alert.description
    assert engine.observe_event("n1", msg, USERS) == []       # the same record read again
    assert engine.fabric.sxid_counts == {("n1", "nvidia-nvswitch1", "PCI:0000:06:00.0", 20034, True): 1}
    assert engine.gpus == {}                                  # no GPU of that name


def test_a_port_below_the_rate_the_site_expects_is_degraded_from_its_first_reading():
    def first(rate, width, expected=None):
        msg = reading(0, rate=rate, width=width)
        if expected is not None:
            msg.expected_gbps = expected
        return trouble(None, msg, highest=None)

    # a 4X HDR cable that trained on one lane at boot: its rate file says 1X, which its width and speed give
    assert first(50.0, 1) == {}
    assert first(50.0, 1, expected=200.0) == {
        "degraded": "runs at 50 Gb/s (1X HDR), below the 200 Gb/s the site expects of it"}
    # half of a split cable (HDR100 is 2X HDR) is none, with no expectation or the site's own
    assert first(100.0, 2) == first(100.0, 2, expected=100.0) == first(200.0, 4, expected=200.0) == {}
    # a port that is down is down, not degraded
    msg = reading(30, state=1, rate=50.0, width=1)
    msg.expected_gbps = 200.0
    assert set(trouble(reading(0), msg)) == {"down"}


def test_a_narrow_port_is_a_finding_once_on_its_node():
    engine = HealthEngine(load_catalog())
    narrow = reading(0, rate=50.0, width=1)
    narrow.expected_gbps = 200.0
    [alert] = engine.observe_port("n1", narrow, USERS)
    assert (alert.rule, alert.severity) == ("fabric_port", "warning")
    assert "port mlx5_0/1 of n1: runs at 50 Gb/s (1X HDR), below the 200 Gb/s the site expects" in alert.description
    again = reading(30, rate=50.0, width=1)
    again.expected_gbps = 200.0
    assert engine.observe_port("n1", again, USERS) == []            # still narrow: said once
    assert [f.uuid for _, f in engine.fabric.node_findings(["n1"], standing=True)] == ["mlx5_0/1"]
