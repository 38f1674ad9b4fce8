"""clusterwatch.slurm.node_drain: `scontrol -o show node NAME` as Slurm 22.05 printed it on the test cluster."""
from __future__ import annotations

from clusterwatch.slurm.node_drain import parse_node_drain

_HEAD = ("NodeName=n1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=3.94 "
         "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:2 NodeAddr=127.0.0.1 NodeHostName=localhost "
         "Port=44169 Version=22.05.8 OS=Linux 6.18.44-fc-v1147 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=8000 "
         "AllocMem=0 FreeMem=21988 Sockets=2 Boards=1 State={state} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A "
         "MCS_label=N/A Partitions=debug  BootTime=2026-12-03T07:54:50 SlurmdStartTime=2026-12-03T13:34:08 "
         "LastBusyTime=2026-12-03T13:34:09 CfgTRES=cpu=2,mem=8000M,billing=2 AllocTRES= CapWatts=n/a "
         "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s")


def test_a_drained_node_gives_its_reason_who_and_when() -> None:
    text = _HEAD.format(state="IDLE+DRAIN") + " Reason=clusterwatch: GPU X lost on n1 [root@2026-12-03T13:34:09]\n"
    got = parse_node_drain(text)
    assert got is not None and got.drained
    assert (got.node, got.state, got.reason, got.set_by, got.set_at) == (
        "n1", "IDLE+DRAIN", "clusterwatch: GPU X lost on n1", "root", "2026-12-03T13:34:09")


def test_a_reason_that_holds_field_names_is_still_one_reason() -> None:
    text = _HEAD.format(state="MIXED+DRAIN") + " Reason=ops: State=IDLE Reason=x [alice@2026-12-03T13:40:00]"
    got = parse_node_drain(text)
    assert got is not None and got.state == "MIXED+DRAIN"
    assert (got.reason, got.set_by) == ("ops: State=IDLE Reason=x", "alice")


def test_a_node_in_service_has_no_reason_and_is_not_drained() -> None:
    got = parse_node_drain(_HEAD.format(state="IDLE+NOT_RESPONDING"))
    assert got is not None and not got.drained and got.reason == "" and got.state == "IDLE+NOT_RESPONDING"


def test_none_or_several_nodes_shown_is_no_answer() -> None:
    assert parse_node_drain("Node n9 not found\n") is None
    line = _HEAD.format(state="IDLE")
    assert parse_node_drain(line + "\n" + line.replace("NodeName=n1", "NodeName=n2")) is None
