"""The fabric's ports from sysfs (agent/health/fabric.py) on a fake tree shaped like /sys/class/infiniband, garbage,
huge files, FIFOs and symlink loops among them; and the NVSwitch SXID lines of the kernel log (agent/health/sxid.py),
read as strictly as XIDs."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from clusterwatch.agent.health.fabric import (
    ExpectedRates,
    FabricReader,
    parse_counter,
    parse_expected_rates,
    parse_rate,
    parse_state,
)
from clusterwatch.agent.health.kmsg import KmsgReader
from clusterwatch.agent.health.monitor import port_to_proto
from clusterwatch.agent.health.sxid import parse_sxid
from clusterwatch.v1 import agent_pb2

from clusterwatch.errors import ConfigError


def port(root: Path, device: str, n: int, *, state="4: ACTIVE", phys="5: LinkUp", rate="200 Gb/sec (4X HDR)",
         layer="InfiniBand", **counters: str) -> Path:
    p = root / device / "ports" / str(n)
    (p / "counters").mkdir(parents=True)
    for name, text in (("state", state), ("phys_state", phys), ("rate", rate), ("link_layer", layer)):
        if text is not None:
            (p / name).write_text(text + "\n")
    for name, text in counters.items():
        (p / "counters" / name).write_text(text + "\n")
    return p


@pytest.mark.parametrize("text, want", [("4: ACTIVE", 4), ("1: DOWN\n", 1), ("5: LinkUp", 5),
                                        ("6: LinkErrorRecovery", 6), ("ACTIVE", None), ("", None),
                                        ("4: ACTIVE; rm -rf", None), ("99999: X", None)])
def test_state_files(text, want):
    assert parse_state(text) == want


@pytest.mark.parametrize("text, want", [("200 Gb/sec (4X HDR)", (200.0, 4, "HDR")),
                                        ("2.5 Gb/sec (1X SDR)\n", (2.5, 1, "SDR")),
                                        ("56 Gb/sec (4X FDR)", (56.0, 4, "FDR")),
                                        ("100 Gb/sec (2X HDR)", (100.0, 2, "HDR")),
                                        ("400 Gb/sec (4X NDR)", (400.0, 4, "NDR")),
                                        ("fast", None), ("200 Gb/sec (4X HDR) extra", None), ("-1 Gb/sec", None)])
def test_rate_files(text, want):
    assert parse_rate(text) == want


@pytest.mark.parametrize("text, want", [("0", 0), ("42\n", 42), ("-1", None), ("1e3", None), ("0x10", None),
                                        (str(1 << 64), None), ("", None)])
def test_counter_files(text, want):
    assert parse_counter(text) == want


def test_a_port_is_read_whole(tmp_path):
    port(tmp_path, "mlx5_0", 1, link_downed="3", symbol_error="12", port_rcv_errors="0")
    port(tmp_path, "mlx5_1", 1, state="1: DOWN", phys="3: Disabled", rate="10 Gb/sec (4X SDR)", layer="Ethernet")
    reader = FabricReader(str(tmp_path), clock=lambda: 100.0)
    a, b = reader.read()
    assert (a.device, a.port, a.state, a.phys_state, a.rate_gbps, a.width, a.speed, a.link_layer, a.time) == (
        "mlx5_0", 1, 4, 5, 200.0, 4, "HDR", "InfiniBand", 100.0)
    assert a.counters == {"link_downed": 3, "symbol_error": 12, "port_rcv_errors": 0}
    assert (b.device, b.state, b.link_layer) == ("mlx5_1", 1, "Ethernet")
    assert reader.errors == 0


def test_hostile_files_are_none_and_counted_never_read_past_the_limit(tmp_path):
    p = port(tmp_path, "mlx5_0", 1, state="garbage", rate="x" * 10_000, link_downed="lots")
    (p / "counters" / "symbol_error").write_bytes(b"1" * (50 << 20))       # huge: read to its limit only
    os.mkfifo(p / "counters" / "port_rcv_errors")                         # would block a plain read
    os.symlink("/etc/shadow", p / "counters" / "link_error_recovery")     # a link in the port's folder
    os.symlink("loop", tmp_path / "loop")                                 # a device that is a symlink loop
    (tmp_path / "bad name;x").mkdir()
    reader = FabricReader(str(tmp_path))
    [r] = reader.read()
    assert (r.state, r.rate_gbps, r.counters) == (None, None, {})
    assert r.phys_state == 5
    assert reader.errors >= 7


def test_a_node_without_infiniband_reads_none(tmp_path):
    reader = FabricReader(str(tmp_path / "absent"))
    assert reader.read() == [] and reader.errors == 0


HEAD = "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up"


def test_sxid_head_lines_parse_and_detail_lines_do_not():
    s = parse_sxid(HEAD)
    assert (s.device, s.pci, s.sxid, s.fatal, s.text) == ("nvidia-nvswitch1", "0000:06:00.0", 20034, True,
                                                           "Link 48 LTSSM Fault Up")
    n = parse_sxid("nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV "
                   "error (First)")
    assert (n.sxid, n.fatal) == (12028, False)
    for line in ("nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 Engine instance 60 Sub-engine "
                 "instance 00",
                 "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {0x10000000, 0x10000000}",
                 "[6781753.400584] " + HEAD,                  # a dmesg prefix: not the driver's line
                 "python: " + HEAD,                           # the words inside another message
                 HEAD.replace("Fatal", "fatal"), HEAD + "\nNVRM: x", "nvidia-nvswitch1: SXid (PCI:zz): 1, Fatal, x"):
        assert parse_sxid(line) is None, line


def test_the_kernel_log_reader_takes_the_kernels_sxids_only(tmp_path):
    got = []
    log = tmp_path / "kmsg"
    log.write_text("")
    reader = KmsgReader(str(log), lambda e: None, on_sxid=got.append, boot_time=1000.0)
    reader.feed(f"3,1,2000000,-;{HEAD}")
    reader.feed(f"11,2,2000000,-;{HEAD}")     # facility 1: written from user space (echo > /dev/kmsg)
    reader.feed(f"3,3,2000000,-;{HEAD.replace('Fatal, ', 'Severity 1, ')}")
    reader.stop()
    assert [(e.line.sxid, e.seq, e.time) for e in got] == [(20034, 1, 1002.0)]
    assert reader.not_kernel == 1


@pytest.mark.parametrize("text, want", [
    ("", ExpectedRates()), ("  ", ExpectedRates()),
    ("200", ExpectedRates(every=200.0)),
    ("200,mlx5_4=100", ExpectedRates(every=200.0, devices={"mlx5_4": 100.0})),
    (" mlx5_0/1=400 , mlx5_0=200 ", ExpectedRates(devices={"mlx5_0": 200.0}, ports={("mlx5_0", 1): 400.0})),
    ("12.5", ExpectedRates(every=12.5))])
def test_expected_rates_parse(text, want):
    assert parse_expected_rates(text) == want


@pytest.mark.parametrize("text", ["fast", "0", "200,", "mlx5_0=", "mlx5_0/x=200", "mlx5 0=200", "200Gb",
                                  "-200", "mlx5_0=0", "200,100", "mlx5_0=200,mlx5_0=400", "a/1=1,a/1=2",
                                  "bad;name=200"])
def test_expected_rates_refuse_what_is_none_of_the_forms(text):
    with pytest.raises(ConfigError, match="--ib-expect-rate"):
        parse_expected_rates(text)


def test_each_reading_carries_the_rate_expected_of_its_port(tmp_path):
    port(tmp_path, "mlx5_0", 1, rate="50 Gb/sec (1X HDR)")      # a 4X cable that trained on one lane at boot
    port(tmp_path, "mlx5_0", 2)
    port(tmp_path, "mlx5_4", 1, rate="100 Gb/sec (2X HDR)")     # half of a split cable (HDR100)
    expect = parse_expected_rates("200,mlx5_4=100,mlx5_0/2=400")
    got = {(r.device, r.port): r.expected_gbps for r in FabricReader(str(tmp_path), expect=expect).read()}
    assert got == {("mlx5_0", 1): 200.0, ("mlx5_0", 2): 400.0, ("mlx5_4", 1): 100.0}
    readings = FabricReader(str(tmp_path)).read()                # the default: nothing expected, none sent
    assert [r.expected_gbps for r in readings] == [None, None, None]
    sent = agent_pb2.FabricPort()
    port_to_proto(readings[0], sent)
    assert not sent.HasField("expected_gbps")
    port_to_proto(FabricReader(str(tmp_path), expect=expect).read()[0], sent)
    assert (sent.expected_gbps, sent.rate_gbps, sent.width) == (200.0, 50.0, 1)
