"""The node's InfiniBand and RoCE ports from sysfs: pure parsers for its files, and a reader of the ports.

Each port is /sys/class/infiniband/DEVICE/ports/N/ (the kernel's Documentation/ABI/stable/sysfs-class-infiniband):

    state        "4: ACTIVE"             the logical state: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER
    phys_state   "5: LinkUp"             2 Polling, 3 Disabled, 4 PortConfigurationTraining, 5 LinkUp,
                                         6 LinkErrorRecovery, 7 Phy Test
    rate         "200 Gb/sec (4X HDR)"   lanes x the lanes' speed ("2.5 Gb/sec (1X SDR)", "56 Gb/sec (4X FDR)")
    link_layer   "InfiniBand"            or "Ethernet" (RoCE)
    counters/    one decimal number a file: link_downed, link_error_recovery, symbol_error, port_rcv_errors, ...

The agent runs as root and the tree is the kernel's, but the reader takes nothing on trust: a file is read
only when it is a regular file (never a FIFO that would block, nor a symlink in the port's folder), at most
READ_LIMIT bytes of it; a value that does not parse is None and counted (`errors`), never logged one by one;
the tree is walked to its fixed depth only, so a symlink loop costs one failed open; names are bounded
in length and number (MAX_DEVICES, MAX_PORTS).

A port that trains at boot on fewer lanes than its cable has (1X of a 4X link) runs at that rate from its first
reading, and nothing in sysfs says it should run faster: the rate the site expects (ExpectedRates, the agent's
--ib-expect-rate) travels with each reading, and the collector's fabric_port compares them. It is the site's to
say, never assumed: a split cable runs its halves at 2X (HDR100 is 2X HDR, 100 Gb/s) by design.
"""
from __future__ import annotations

import os
import re
import stat
import time
from dataclasses import dataclass, field
from typing import Callable

from clusterwatch.errors import ConfigError

__all__ = ["PortReading", "FabricReader", "ExpectedRates", "parse_state", "parse_rate", "parse_counter",
           "parse_expected_rates", "COUNTERS", "IB_SYSFS", "READ_LIMIT", "MAX_DEVICES", "MAX_PORTS"]

IB_SYSFS = "/sys/class/infiniband"
# the counters that tell a link's health (the port's traffic counters are not health)
COUNTERS = ("link_downed", "link_error_recovery", "symbol_error", "port_rcv_errors",
            "port_rcv_remote_physical_errors", "local_link_integrity_errors", "excessive_buffer_overrun_errors",
            "port_xmit_discards")
READ_LIMIT = 64          # a sysfs value is a line of a few words; more is not the kernel's
MAX_DEVICES = 64
MAX_PORTS = 16
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_STATE = re.compile(r"(\d{1,2}): ?[A-Za-z_ ]{1,40}")
_RATE = re.compile(r"(?P<gbps>\d{1,5}(?:\.\d{1,3})?) Gb/sec(?: \((?P<width>\d{1,2})X ?(?P<speed>[A-Z0-9]{0,8})\))?")
_NUMBER = re.compile(r"\d{1,20}")
_EXPECT = re.compile(r"(?:(?P<device>[A-Za-z0-9_.:-]{1,64})(?:/(?P<port>\d{1,2}))?=)?(?P<gbps>\d{1,5}(?:\.\d{1,3})?)")


def parse_state(text: str) -> int | None:
    """The number of a `state` or `phys_state` file ("4: ACTIVE" → 4); None for anything else."""
    m = _STATE.fullmatch(text.strip())
    return int(m.group(1)) if m else None


def parse_rate(text: str) -> tuple[float, int | None, str] | None:
    """A `rate` file as (Gb/s, lanes, the lanes' generation): "200 Gb/sec (4X HDR)" → (200.0, 4, "HDR");
    None for anything else."""
    m = _RATE.fullmatch(text.strip())
    if m is None:
        return None
    width = int(m.group("width")) if m.group("width") else None
    return float(m.group("gbps")), width, m.group("speed") or ""


def parse_counter(text: str) -> int | None:
    """A counter file's decimal number; None for anything else (a counter fits 64 bits)."""
    value = text.strip()
    if not _NUMBER.fullmatch(value):
        return None
    n = int(value)
    return n if n < 1 << 64 else None


@dataclass(frozen=True, slots=True)
class ExpectedRates:
    """The rate, Gb/s, the site expects of its ports: one for every port, a device's, a port's (the most
    specific wins); no entry: nothing expected."""

    every: float | None = None
    devices: dict[str, float] = field(default_factory=dict)
    ports: dict[tuple[str, int], float] = field(default_factory=dict)

    def of(self, device: str, port: int) -> float | None:
        got = self.ports.get((device, port))
        if got is None:
            got = self.devices.get(device, self.every)
        return got

    def __bool__(self) -> bool:
        return self.every is not None or bool(self.devices) or bool(self.ports)


def parse_expected_rates(text: str) -> ExpectedRates:
    """--ib-expect-rate: comma-separated GBPS (every port), DEVICE=GBPS (its ports), DEVICE/PORT=GBPS (one port),
    as "200,mlx5_2=100,mlx5_0/2=400"; "" is nothing expected. ConfigError names the entry that is none of these,
    a rate of 0 or one said twice."""
    if not text.strip():
        return ExpectedRates()
    every: float | None = None
    devices: dict[str, float] = {}
    ports: dict[tuple[str, int], float] = {}
    for entry in (e.strip() for e in text.split(",")):
        m = _EXPECT.fullmatch(entry)
        if m is None or float(m.group("gbps")) <= 0:
            raise ConfigError(f"--ib-expect-rate: {entry[:80]!r} is not GBPS, DEVICE=GBPS or DEVICE/PORT=GBPS "
                              "with a rate above 0 (200, mlx5_2=100, mlx5_0/1=400)")
        gbps, device = float(m.group("gbps")), m.group("device")
        if device is None:
            seen, every = every is not None, gbps
        elif m.group("port") is None:
            seen, devices[device] = device in devices, gbps
        else:
            key = (device, int(m.group("port")))
            seen, ports[key] = key in ports, gbps
        if seen:
            raise ConfigError(f"--ib-expect-rate: {entry[:80]!r} says again what an earlier entry said")
    return ExpectedRates(every, devices, ports)


@dataclass(frozen=True, slots=True)
class PortReading:
    """One port at one read; None: not known (absent, or garbage)."""

    device: str
    port: int
    time: float
    state: int | None = None
    phys_state: int | None = None
    rate_gbps: float | None = None
    width: int | None = None
    speed: str = ""
    link_layer: str = ""
    counters: dict[str, int] = field(default_factory=dict)
    expected_gbps: float | None = None     # the rate the site expects of it (ExpectedRates)


class FabricReader:
    """Reads every port under `root` (/sys/class/infiniband, or a tree shaped like it in tests).

    `read()` returns a PortReading a port; a node without InfiniBand or RoCE has no `root` and reads none.
    Unreadable or malformed values are counted in `errors`. `expect`: the rates the site expects of its ports,
    given with each reading.
    """

    def __init__(self, root: str = IB_SYSFS, *, clock: Callable[[], float] = time.time,
                 expect: ExpectedRates | None = None) -> None:
        self.root = root
        self._clock = clock
        self._expect = expect or ExpectedRates()
        self.errors = 0

    def _read(self, path: str) -> str | None:
        """The text of a regular file, at most READ_LIMIT bytes; None (counted) when it is not one or is longer."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None          # a file this driver does not give: not an error
        except OSError:
            self.errors += 1     # a link, a loop, no permission
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                self.errors += 1
                return None
            data = os.read(fd, READ_LIMIT + 1)
        except OSError:
            self.errors += 1
            return None
        finally:
            os.close(fd)
        if len(data) > READ_LIMIT:
            self.errors += 1
            return None
        return data.decode("ascii", "replace")

    def _value(self, path: str, parse: Callable[[str], object]) -> object:
        text = self._read(path)
        if text is None:
            return None
        value = parse(text)
        if value is None:
            self.errors += 1
        return value

    def _names(self, path: str, limit: int) -> list[str]:
        try:
            names = sorted(os.listdir(path))
        except FileNotFoundError:
            return []
        except OSError:
            self.errors += 1
            return []
        good = [n for n in names if _NAME.fullmatch(n)]
        self.errors += len(names) - len(good)
        if len(good) > limit:
            self.errors += 1
        return good[:limit]

    def read(self) -> list[PortReading]:
        out = []
        for device in self._names(self.root, MAX_DEVICES):
            ports = os.path.join(self.root, device, "ports")
            for name in self._names(ports, MAX_PORTS):
                if not name.isdigit():
                    self.errors += 1
                    continue
                out.append(self._port(device, int(name), os.path.join(ports, name)))
        return out

    def _port(self, device: str, port: int, path: str) -> PortReading:
        now = self._clock()
        rate = self._value(os.path.join(path, "rate"), parse_rate)
        layer = self._read(os.path.join(path, "link_layer"))
        layer = layer.strip() if layer is not None else ""
        if layer and not _NAME.fullmatch(layer):
            self.errors += 1
            layer = ""
        counters = {}
        for name in COUNTERS:
            value = self._value(os.path.join(path, "counters", name), parse_counter)
            if value is not None:
                counters[name] = value
        return PortReading(device=device, port=port, time=now,
                           state=self._value(os.path.join(path, "state"), parse_state),
                           phys_state=self._value(os.path.join(path, "phys_state"), parse_state),
                           rate_gbps=rate[0] if rate else None, width=rate[1] if rate else None,
                           speed=rate[2] if rate else "", link_layer=layer, counters=counters,
                           expected_gbps=self._expect.of(device, port))
