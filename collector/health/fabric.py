"""The node's fabric: its InfiniBand / RoCE ports (the agent's FabricPort readings) and its NVSwitches (SXID events).

A fabric finding is the node's, not one GPU's: every rank on the node sends and receives through its ports and
its switches, so the finding names every job on the node, and a stall of any of them names it as a likely cause.
Two rules:

- fabric_port: a port that flaps (link_downed rose, or it left ACTIVE), retrains (link_error_recovery rose),
  runs below its rate (below the rate the site expects of it, the agent's --ib-expect-rate: a port that trained
  narrow at boot has run at nothing higher; below the highest the collector has seen it run at; or below what its
  width and speed give), or climbs in errors (symbol, receive, link integrity, buffer overrun) faster than
  FabricRule allows.
  It stands while its trouble lasts (a flap for `flap_window_s` after the last one).
- nvswitch_sxid: an SXID the agent read in the kernel log; critical when the driver's line says Fatal, a
  warning when it says Non-fatal (DOMAIN.md gives no catalogue of SXID severities). A moment, like an XID.

`port_trouble` decides from two readings, pure; FabricHealth keeps each port's last reading and its highest
rate, each node's findings, and the counts /metrics exports. A port never seen ACTIVE (an unused second port)
is no trouble. A counter that went down (a reset, a reboot) says nothing.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from clusterwatch.collector.health.decisions import GpuUser, HealthFinding, worst_first
from clusterwatch.collector.rules.causes import Cause

from clusterwatch.humanize import duration

__all__ = ["FabricRule", "PortState", "PortView", "FabricHealth", "port_trouble", "port_name", "sxid_finding",
           "port_finding", "fabric_cause", "FABRIC_RULES", "STATE_NAMES", "LANE_GBPS", "ERROR_COUNTERS"]

FABRIC_RULES = ("fabric_port", "nvswitch_sxid")
ACTIVE = 4
STATE_NAMES = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
PHYS_STATE_NAMES = {1: "Sleep", 2: "Polling", 3: "Disabled", 4: "PortConfigurationTraining", 5: "LinkUp",
                    6: "LinkErrorRecovery", 7: "Phy Test"}
# a lane's rate by generation, as the kernel's rate file counts it (drivers/infiniband/core/sysfs.c, rate_show)
LANE_GBPS = {"SDR": 2.5, "DDR": 5.0, "QDR": 10.0, "FDR10": 10.0, "FDR": 14.0, "EDR": 25.0, "HDR": 50.0,
             "NDR": 100.0, "XDR": 200.0}
# errors a healthy link shows rarely; each one is a packet or a symbol lost on the wire
ERROR_COUNTERS = ("symbol_error", "port_rcv_errors", "port_rcv_remote_physical_errors", "local_link_integrity_errors",
                  "excessive_buffer_overrun_errors")
_KEEP_FINDINGS = 20          # per node
_ADVICE = ("Check the port and its cable (ibstat; perfquery or ethtool -S for RoCE; the switch's side of the link); "
           "reseat or replace the cable, and drain the node if the link keeps flapping.")


@dataclass(frozen=True, slots=True)
class FabricRule:
    """fabric_port's thresholds."""

    flap_window_s: float = 600.0     # a link that went down this long ago still flaps
    errors_per_min: float = 10.0     # ERROR_COUNTERS summed, between two readings


@dataclass(frozen=True, slots=True)
class PortState:
    """One port at one reading (a FabricPort's fields, None where the agent sent none)."""

    time: float
    state: int | None = None
    phys_state: int | None = None
    rate_gbps: float | None = None
    width: int | None = None
    speed: str = ""
    counters: dict[str, int] = field(default_factory=dict)
    expected_gbps: float | None = None      # the rate the site expects of it (the agent's --ib-expect-rate)

    @classmethod
    def of(cls, msg: Any) -> PortState:
        def opt(name: str) -> Any:
            return getattr(msg, name) if msg.HasField(name) else None

        return cls(time=msg.time, state=opt("state"), phys_state=opt("phys_state"), rate_gbps=opt("rate_gbps"),
                   width=opt("width"), speed=msg.speed, counters=dict(msg.counters),
                   expected_gbps=opt("expected_gbps"))


def _rise(before: PortState, after: PortState, name: str) -> int:
    a, b = before.counters.get(name), after.counters.get(name)
    return b - a if a is not None and b is not None and b >= a else 0


def port_trouble(rule: FabricRule, before: PortState | None, after: PortState, *, highest_gbps: float | None,
                 was_active: bool, last_flap: float | None) -> dict[str, str]:
    """What is wrong with a port at `after`: kind (down, flapping, degraded, errors) → the words for it; {} when
    nothing. `before` is its previous reading, `highest_gbps` the highest rate seen before `after`, `was_active`
    whether it was ever ACTIVE, `last_flap` when it last went down (or retrained) before `after`."""
    out: dict[str, str] = {}
    active = after.state == ACTIVE
    if after.state is not None and not active and was_active:
        phys = PHYS_STATE_NAMES.get(after.phys_state or 0)
        out["down"] = f"down ({STATE_NAMES.get(after.state, str(after.state))}" + (f", {phys})" if phys else ")")
    downs = _rise(before, after, "link_downed") if before else 0
    retrains = _rise(before, after, "link_error_recovery") if before else 0
    if downs or retrains:
        said = [f"went down {downs} time{'s' if downs != 1 else ''}"] if downs else []
        said += [f"retrained {retrains} time{'s' if retrains != 1 else ''}"] if retrains else []
        out["flapping"] = f"flapping: {' and '.join(said)} in {after.time - before.time:.0f} s"
    elif last_flap is not None and after.time - last_flap <= rule.flap_window_s:
        out["flapping"] = f"flapping: last went down {after.time - last_flap:.0f} s ago"
    if active and after.rate_gbps is not None:
        nominal = LANE_GBPS.get(after.speed, 0.0) * (after.width or 0)
        expected = after.expected_gbps
        if expected is not None and after.rate_gbps < expected:
            lanes = f" ({after.width}X {after.speed})" if after.width and after.speed else ""
            out["degraded"] = (f"runs at {after.rate_gbps:g} Gb/s{lanes}, below the {expected:g} Gb/s the site "
                               "expects of it")
        elif highest_gbps is not None and after.rate_gbps < highest_gbps:
            out["degraded"] = f"runs at {after.rate_gbps:g} Gb/s, below the {highest_gbps:g} Gb/s it ran at"
        elif nominal and after.rate_gbps < nominal:
            out["degraded"] = (f"runs at {after.rate_gbps:g} Gb/s, below the {nominal:g} Gb/s of "
                               f"{after.width}X {after.speed}")
    if before is not None and after.time > before.time:
        errors = {name: _rise(before, after, name) for name in ERROR_COUNTERS}
        total = sum(errors.values())
        if total * 60.0 / (after.time - before.time) >= rule.errors_per_min:
            which = ", ".join(f"{n} {name}" for name, n in errors.items() if n)
            out["errors"] = f"{which} in {after.time - before.time:.0f} s"
    return out


def port_name(device: str, port: int) -> str:
    return f"{device}/{port}"


def _jobs(users: Sequence[GpuUser]) -> str:
    return ", ".join(sorted({f"job {u.job_id}" for u in users}))


def _labels(base: dict[str, str], users: Sequence[GpuUser]) -> dict[str, str]:
    jobs = sorted({u.job_id for u in users})
    if jobs:
        base["job_id"] = ",".join(jobs)
    return base


def port_finding(node: str, port: str, link_layer: str, trouble: dict[str, str],
                 users: Sequence[GpuUser] = ()) -> HealthFinding:
    """A port's trouble as a finding on its node, naming every job on the node."""
    kind = "RoCE" if link_layer == "Ethernet" else "InfiniBand"
    who = f"; every rank on the node sends through it: {_jobs(users)}" if users else ""
    description = f"{kind} port {port} of {node}: " + "; ".join(trouble.values()) + who
    severity = "critical" if "down" in trouble else "warning"
    return HealthFinding(rule="fabric_port", severity=severity, node=node, uuid=port, description=description,
                         advice=_ADVICE, labels=_labels({"port": port, "trouble": ",".join(sorted(trouble))}, users))


def sxid_finding(node: str, msg: Any, users: Sequence[GpuUser] = ()) -> HealthFinding:
    """An SXID event (a HealthEvent of kind sxid) as a finding on its node."""
    word = "Fatal" if msg.fatal else "Non-fatal"
    switch = f"PCI:{msg.pci}"
    who = f"; the node's NVLink traffic goes through it: {_jobs(users)}" if users else ""
    description = (f"SXID {msg.sxid} ({word}) on NVSwitch {msg.device or switch} ({switch}) of {node}: "
                   f"{msg.text}{who}")
    advice = ("A fatal NVSwitch error stops the node's NVLink fabric: drain the node and reset its GPUs and "
              "switches (or reboot it); look the SXID up in NVIDIA's Fabric Manager user guide." if msg.fatal else
              "The switch corrected it; the same SXID again and again on one link is a failing link: run the "
              "node's diagnostics (dcgmi diag -r 3) when its jobs end.")
    return HealthFinding(rule="nvswitch_sxid", severity="critical" if msg.fatal else "warning", node=node,
                         uuid=switch, description=description, advice=advice,
                         action="drain" if msg.fatal else "none",
                         labels=_labels({"sxid": str(msg.sxid), "switch": switch}, users))


def fabric_cause(t: float, f: HealthFinding, now: float) -> Cause:
    """A fabric finding on one of a job's nodes as its stall's likely cause: a collective waits on its slowest
    link, and a port that flaps or an NVSwitch that faults holds every rank that sends through it."""
    what = f"SXID {f.labels.get('sxid')}" if f.rule == "nvswitch_sxid" else "fabric port"
    where = f.labels.get("switch") or f.labels.get("port") or f.uuid
    text = (f"{what} {where} on {f.node}, {duration(max(0.0, now - t))} before: "
            f"{f.description.split('; every rank')[0].split('; the node')[0]}")
    figures: dict[str, Any] = {"cause": "fabric", "cause_rule": f.rule, "cause_node": f.node, "cause_port": where}
    if f.rule == "nvswitch_sxid":
        figures["cause_sxid"] = int(f.labels["sxid"])
    return Cause("fabric", text, figures)


@dataclass(slots=True)
class PortView:
    """What the collector holds about one port."""

    link_layer: str = ""
    last: PortState | None = None
    highest_gbps: float | None = None
    was_active: bool = False
    last_flap: float | None = None
    trouble: dict[str, str] = field(default_factory=dict)     # what holds now (port_trouble's)


class FabricHealth:
    """The fabric's readings and events of every node in, findings out (the HealthEngine fires them).

    Args:
        rule: fabric_port's thresholds.
    """

    def __init__(self, rule: FabricRule = FabricRule()) -> None:
        self.rule = rule
        self.ports: dict[tuple[str, str], PortView] = {}                     # (node, DEVICE/N)
        self.findings: dict[str, list[tuple[float, HealthFinding]]] = {}     # node → (time, finding), newest last
        self.sxid_counts: dict[tuple[str, str, str, int, bool], int] = {}    # (node, device, switch, SXID, fatal)

    def observe_port(self, node: str, msg: Any, users: Sequence[GpuUser]) -> HealthFinding | None:
        """One FabricPort of `node`; the finding to raise when a trouble begins that was not there before."""
        name = port_name(msg.device, msg.port)
        v = self.ports.get((node, name))
        if v is None:
            v = self.ports[(node, name)] = PortView()
        after = PortState.of(msg)
        if v.last is not None and after.time <= v.last.time:
            return None        # a reading resent, or older than the one held
        trouble = port_trouble(self.rule, v.last, after, highest_gbps=v.highest_gbps, was_active=v.was_active,
                               last_flap=v.last_flap)
        if v.last is not None and (_rise(v.last, after, "link_downed") or _rise(v.last, after, "link_error_recovery")):
            v.last_flap = after.time
        if after.state == ACTIVE:
            v.was_active = True
            if after.rate_gbps is not None and (v.highest_gbps is None or after.rate_gbps > v.highest_gbps):
                v.highest_gbps = after.rate_gbps
        v.link_layer, v.last = msg.link_layer, after
        new = set(trouble) - set(v.trouble)
        v.trouble = trouble
        if not new:
            return None
        finding = port_finding(node, name, msg.link_layer, trouble, users)
        self.keep(node, after.time, finding)
        return finding

    def observe_sxid(self, node: str, msg: Any, users: Sequence[GpuUser]) -> HealthFinding:
        key = (node, msg.device, f"PCI:{msg.pci}", msg.sxid, msg.fatal)
        self.sxid_counts[key] = self.sxid_counts.get(key, 0) + 1
        finding = sxid_finding(node, msg, users)
        self.keep(node, msg.time, finding)
        return finding

    def keep(self, node: str, t: float, f: HealthFinding) -> None:
        self.findings[node] = (self.findings.get(node, []) + [(t, f)])[-_KEEP_FINDINGS:]

    def _standing(self, node: str) -> list[HealthFinding]:
        """The node's fabric_port findings whose trouble still holds: each port's latest."""
        out, seen = [], set()
        for _, f in reversed(self.findings.get(node, [])):
            v = self.ports.get((node, f.uuid))
            if f.rule == "fabric_port" and f.uuid not in seen and v is not None and v.trouble:
                seen.add(f.uuid)
                out.append(f)
        return out

    def node_findings(self, nodes: Sequence[str], since: float = 0.0,
                      standing: bool = False) -> list[tuple[float, HealthFinding]]:
        """The findings on these nodes since `since`, worst first; with `standing`, also older ones that still
        hold (a job that starts on a node with a degraded port is told so)."""
        got = []
        for node in nodes:
            held = self._standing(node) if standing else ()
            got += [(t, f) for t, f in self.findings.get(node, []) if t >= since or any(f is h for h in held)]
        order = {id(f): i for i, f in enumerate(worst_first([f for _, f in got]))}
        return sorted(got, key=lambda tf: order[id(tf[1])])
