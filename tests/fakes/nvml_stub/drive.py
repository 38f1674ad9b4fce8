"""Child process of `tests.fakes.nvml_stub.drive`: the NVML source over the real pynvml and the stand-in.

Reads the spec (JSON) on stdin, prints the result (JSON) on stdout; see `drive` for both.
"""
from __future__ import annotations

import inspect
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.fakes.nvml_stub import write_state  # noqa: E402


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def main() -> None:
    import pynvml
    from clusterwatch.agent.backends.nvml import NvmlGpuSource

    from clusterwatch.errors import SourceUnavailable

    spec = json.load(sys.stdin)
    state = Path(spec["state"])
    log = logging.getLogger("nvml-stub-drive")
    lines = _Lines()
    log.addHandler(lines)
    log.propagate = False
    mono = [time.monotonic()]
    steps = spec["steps"]
    clock = (lambda: mono[0]) if any("mono" in s for s in steps) else time.monotonic
    if steps and "mono" in steps[0]:
        mono[0] = steps[0]["mono"]
    out: dict = {"polls": [], "log": lines.lines, "open_error": None, "inventory": []}
    started = time.monotonic()
    # Only the arguments this version of the source takes, so a case can run against older code.
    accepted = inspect.signature(NvmlGpuSource).parameters
    kwargs = {k: v for k, v in {**spec["source"], "log": log, "clock": clock}.items() if k in accepted}
    try:
        src = NvmlGpuSource(pynvml, **kwargs)
    except SourceUnavailable as exc:
        out["open_error"] = str(exc)
        print(json.dumps(out))
        return
    out["open_seconds"] = time.monotonic() - started
    out["inventory"] = [[g.uuid, g.index, g.name, g.memory_total_bytes] for g in src.inventory()]
    out["serials"] = {g.uuid: getattr(g, "serial", None) for g in src.inventory()}
    out["pids_hidden"] = getattr(src, "pids_hidden", None)
    for i, step in enumerate(steps):
        if i > 0 and "state" in step:
            write_state(state, step["state"])
        if step.get("pause"):
            time.sleep(step["pause"])
        if "mono" in step:
            mono[0] = step["mono"]
        t0 = time.monotonic()
        poll = src.poll(step.get("now", time.time()))
        out["polls"].append({
            # the first five fields, as before the energy counter; that is under "energy" (UUID → mJ or None)
            "readings": [list(r)[:5] for r in poll.readings],
            "energy": {r.uuid: getattr(r, "energy_mj", None) for r in poll.readings},
            "processes": {str(pid): [list(u) for u in uses] for pid, uses in poll.processes.items()},
            "errors": poll.errors,
            "stale": getattr(poll, "stale", None),
            "seconds": time.monotonic() - t0,
            "inventory": [[g.uuid, g.index, g.name, g.memory_total_bytes] for g in src.inventory()],
            "pid_visibility": getattr(src, "pid_visibility", None),
            "activity": {uuid: a._asdict() for uuid, a in getattr(poll, "activity", {}).items()},
        })
    t0 = time.monotonic()
    src.close()
    out["close_seconds"] = time.monotonic() - t0
    print(json.dumps(out))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
