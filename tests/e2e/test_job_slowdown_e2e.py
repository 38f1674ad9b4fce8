"""job_slowdown for real: two real ranks of a job on two GPUs of the C stand-in for the driver, read by a real
agent through the real pynvml, and a real collector with short rule windows (a rules file). Rank 1's GPU has its
clocks held down (NVML's clock-event reason 0x8, hardware slowdown) and, with it, the job's steps slow to half
(every collective waits for the slow GPU): the alert names that GPU and rank 1. Without clusterwatch.train (ranks
that report no steps), the GPU side alone raises it on the held GPU, also one held between its reads that only
NVML's violation time shows. A GPU whose PCIe replays climb is named as the slow job's link. Ranks that count
their tokens are judged in tokens/s: a batch that doubles (half the steps/s, twice the tokens a step) raises
nothing, sequences that halve then (the steps/s held, half the tokens/s) raise it in tokens.

The ranks' steps follow a clock (20 steps/s, 10 once slow), not a sleep per step: a loaded test machine
then changes when a step is read, never the rate the rule measures.
"""
from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fakes.nvml_stub import child_env, fixtures, write_state
from tests.support.helpers import CLI, Collector, Proc, cli, unique_job_id, wait_for

pytestmark = pytest.mark.e2e
stub_lib = fixtures.stub_lib  # the stand-in's fixture, used by name

GiB = 1024**3
HELD_DOWN = 0x8  # nvmlClocksEventReasonHwSlowdown
# Windows of seconds, not minutes: 2 s buckets, a 10 s window against a 12 s baseline after 2 s of warm-up
RULES = ("[job_slowdown]\nbucket_s = 2\nbaseline_s = 12\nwarmup_s = 2\nfor_s = 10\ndrop_percent = 30\n"
         "low_fraction = 0.7\n")
RANK = """
import os, sys, time
from clusterwatch import train
slow = sys.argv[1]
big = sys.argv[2] if len(sys.argv) > 2 else None  # tokens counted; twice the tokens a step while this file is
step, tokens, last = 0.0, 0.0, time.monotonic()
while True:
    now = time.monotonic()
    steps = (now - last) * (10.0 if os.path.exists(slow) else 20.0)
    step += steps
    last = now
    if big is None:
        train.report(step=int(step), loss=1.0)
    else:
        tokens += steps * (8192 if os.path.exists(big) else 4096)
        train.report(step=int(step), loss=1.0, tokens=int(tokens))
    time.sleep(0.05)
"""


@dataclass
class SlowingJob:
    """A job's two ranks on GPU-sd0 and GPU-sd1 of node `node`, their agent and the collector."""

    job_id: str
    node: str
    ranks: list
    collector: Collector
    agent: Proc
    state: Path
    slow_file: Path
    big_file: Path | None = None

    def gpus(self, held: int | None = None, health: str = "") -> None:
        """The stand-in's state: each rank busy on its GPU; GPU `held`'s clocks held down (hardware slowdown);
        `health`: the stand-in's health lines (violation time, link counters)."""
        write_state(self.state, "".join(
            f"gpu GPU-sd{r} total={80 * GiB} used={20 * GiB} util=99 power=300000 pci=0000:{0x3b + r:02x}:00 "
            f"temp=60 throttle={HELD_DOWN if r == held else 0} name=NVIDIA H100\n"
            f"proc GPU-sd{r} {p.pid} {8 * GiB}\nsample GPU-sd{r} {p.pid} 99 age_us=100000\n"
            for r, p in enumerate(self.ranks)) + health)

    def slow_down(self, rank: int) -> None:
        """Rank `rank`'s GPU held down; with steps, the whole job steps at half its speed from now."""
        self.gpus(held=rank)
        self.slow_file.touch()

    def firing(self) -> dict | None:
        r = cli("alerts", "--collector", self.collector.address, "--json")
        if r.returncode != 0:
            return None
        return next((a for a in json.loads(r.stdout).get("alerts", [])
                     if a["rule"] == "job_slowdown" and a["state"] == "firing"), None)

    def processes(self) -> list[dict]:
        """The job's processes as `status --json` shows them (none before the collector knows the job)."""
        r = cli("status", self.job_id, "--collector", self.collector.address, "--json")
        return json.loads(r.stdout).get("processes", []) if r.returncode == 0 else []


@contextmanager
def slowing_job(stub_lib: Path, tmp_path: Path, steps: bool, *collector_args: str,
                tokens: bool = False) -> Iterator[SlowingJob]:
    """Start the ranks (reporting steps through clusterwatch.train where `steps`, with their tokens where `tokens`,
    else silent), the stand-in's state, the collector with RULES (and `collector_args`) and the agent (NVML,
    health counters every second); stop them all after."""
    from clusterwatch.agent.spool import write_event

    from clusterwatch.model import JobEvent

    state = tmp_path / "nvml-state.txt"
    env = {k: v for k, v in child_env(stub_lib, state).items() if not k.startswith("SLURM")}
    job_id, node = unique_job_id(), "sd-node"
    sock, slow, script = tmp_path / "train.sock", tmp_path / "slow", tmp_path / "rank.py"
    script.write_text(RANK)
    big = tmp_path / "big" if tokens else None
    args = [sys.executable, str(script), str(slow), *([str(big)] if big else [])] if steps else ["sleep", "600"]
    ranks = [Proc(args, tmp_path / f"rank{r}.log",
                  env={**env, "CLUSTERWATCH_TRAIN_SOCKET": str(sock), "SLURM_JOB_ID": job_id, "SLURM_PROCID": str(r),
                       "SLURM_LOCALID": str(r), "SLURM_STEP_ID": "0"}) for r in (0, 1)]
    spool = tmp_path / "spool"
    write_event(str(spool), JobEvent("start", job_id, time.time(), gpu_indexes="0,1"))
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES)
    job = SlowingJob(job_id, node, ranks, None, None, state, slow, big)  # type: ignore[arg-type]
    job.gpus()
    job.collector = Collector(tmp_path, "--rules", str(rules), "--rules-interval", "1", *collector_args)
    job.agent = Proc([*CLI, "agent", "--collector", job.collector.address, "--node", node, "--interval", "0.5",
                      "--send-interval", "0", "--health-interval", "1", "--gpu-source", "nvml", "--no-provenance",
                      "--spool-dir", str(spool), "--train-socket", str(sock), "--kmsg", "none"],
                     tmp_path / "agent.log", env={**env, "SLURMD_NODENAME": node})
    try:
        yield job
    finally:
        print(cli("alerts", "--collector", job.collector.address, "--json").stdout)
        code = job.agent.stop()
        job.collector.stop()
        for p in ranks:
            p.stop()
        assert code == 0, job.agent.text()


def _at_speed(job: SlowingJob) -> None:
    """A steady baseline: 2 s of warm-up, then six 2 s buckets at speed."""
    wait_for(lambda: max((p.get("step") or 0 for p in job.processes()), default=0) >= 40, timeout=90,
             interval=0.5, what="the job's steps at the collector")
    _wait(16, "a baseline at speed")
    assert job.firing() is None


def _wait(seconds: float, what: str) -> None:
    until = time.monotonic() + seconds
    wait_for(lambda: time.monotonic() > until, timeout=seconds + 15, interval=0.5, what=what)


def _slow_and_fired(job: SlowingJob) -> dict:
    """A steady baseline first, then rank 1's GPU held down and the steps at half speed: the firing
    job_slowdown."""
    _at_speed(job)
    job.slow_down(1)
    return wait_for(job.firing, timeout=90, interval=1.0, what="job_slowdown firing")


def test_a_held_down_gpu_slows_the_job_and_the_alert_names_that_gpu_and_rank(stub_lib: Path,
                                                                                tmp_path: Path) -> None:
    with slowing_job(stub_lib, tmp_path, steps=True) as job:
        fired = _slow_and_fired(job)
    assert fired["job_id"] == job.job_id, fired
    assert (fired.get("cause"), fired.get("cause_gpu"), fired.get("cause_rank"), fired.get("cause_node")) == (
        "gpu_clocks", "GPU-sd1", 1, "sd-node"), fired
    desc = fired["description"]
    assert "% slower than it did" in desc and "hardware slowdown" in desc and "of rank 1 on sd-node" in desc, desc


def test_without_steps_the_gpu_side_alone_names_the_held_gpu(stub_lib: Path, tmp_path: Path) -> None:
    with slowing_job(stub_lib, tmp_path, steps=False) as job:
        # the collector knows the job's two ranks on their GPUs before one is held down
        wait_for(lambda: sorted(p.get("rank") for p in job.processes()) == [0, 1], timeout=90, interval=0.5,
                 what="both ranks at the collector")
        assert job.firing() is None
        job.slow_down(1)
        fired = wait_for(job.firing, timeout=90, interval=1.0, what="job_slowdown from the GPU side")
    assert (fired["job_id"], fired["gpu"], fired["rank"], fired["node"]) == (job.job_id, "GPU-sd1", 1, "sd-node"), fired
    assert fired.get("cause") == "gpu_clocks" and "judged from the GPUs alone" in fired["description"], fired


def test_without_steps_a_gpu_held_between_its_reads_is_named_by_its_violation_time(stub_lib: Path,
                                                                                  tmp_path: Path) -> None:
    """GPU-sd1 held thermally 0.8 s of each second while its clock-event reasons read clear at every read: NVML's
    violation time, through the real binding's nvmlDeviceGetViolationStatus, is what names it."""
    with slowing_job(stub_lib, tmp_path, steps=False) as job:
        wait_for(lambda: sorted(p.get("rank") for p in job.processes()) == [0, 1], timeout=90, interval=0.5,
                 what="both ranks at the collector")
        begun = time.monotonic()

        def held_then_fired() -> dict | None:
            job.gpus(health=f"health GPU-sd1 viol_thermal_ns={int(0.8e9 * (time.monotonic() - begun))}\n")
            return job.firing()

        fired = wait_for(held_then_fired, timeout=90, interval=0.5, what="job_slowdown from the violation time")
    assert (fired["gpu"], fired["rank"], fired.get("cause")) == ("GPU-sd1", 1, "gpu_clocks"), fired
    assert "by NVML's violation time" in fired["description"], fired


def test_a_gpu_whose_pcie_replays_climb_is_named_as_the_slow_jobs_link(stub_lib: Path, tmp_path: Path) -> None:
    """The steps slow to half while GPU-sd1's PCIe replays climb (50 a second) and GPU-sd0's stay at none, the
    clocks of both free: the alert names GPU-sd1's link and rank 1."""
    with slowing_job(stub_lib, tmp_path, steps=True) as job:
        _at_speed(job)
        begun = time.monotonic()
        job.slow_file.touch()

        def replays_then_fired() -> dict | None:
            job.gpus(health=f"health GPU-sd1 replay={int(50 * (time.monotonic() - begun))}\n")
            return job.firing()

        fired = wait_for(replays_then_fired, timeout=90, interval=1.0, what="job_slowdown naming the link")
    assert (fired.get("cause"), fired.get("cause_gpu"), fired.get("cause_rank")) == (
        "gpu_link_errors", "GPU-sd1", 1), fired
    assert "PCIe replays in the slow window, the others none" in fired["description"], fired


def test_a_recorded_slowdown_replays_to_the_same_alert_and_culprit(stub_lib: Path, tmp_path: Path) -> None:
    """`record` the job once job_slowdown fires, `replay` the trace with the same rules: the same alert, naming
    the same GPU and rank from the trace's gpu_health records (every sample a history point: --history-step 0)."""
    trace = tmp_path / "slow.jsonl"
    with slowing_job(stub_lib, tmp_path, True, "--history-step", "0") as job:
        live = _slow_and_fired(job)
        # a few seconds more of the slow job: replay cuts its buckets at every line, where the live rules looked
        # once a second, so its window may fill a bucket later than live's
        _wait(6, "the slow job a little longer")
        recorded = cli("record", job.job_id, "--collector", job.collector.address, "-o", str(trace))
        assert recorded.returncode == 0, recorded.stderr
    replayed = cli("replay", str(trace), "--rules", str(tmp_path / "rules.toml"), "--format", "jsonl")
    assert replayed.returncode == 0, replayed.stderr
    fired = [e for e in map(json.loads, replayed.stdout.splitlines())
             if e["rule"] == "job_slowdown" and e["state"] == "firing"]
    assert len(fired) == 1, replayed.stdout
    got = fired[0]  # its figures at the top level, as AlertEvent.to_dict gives them
    assert (got["job_id"], got["node"], got.get("cause"), got.get("cause_gpu"), got.get("cause_rank")) == (
        live["job_id"], live["node"], live["cause"], live["cause_gpu"], live["cause_rank"]), (got, live)
    assert "hardware slowdown" in got["description"], got


def test_counted_tokens_make_a_doubled_batch_no_slowdown_and_shorter_sequences_one(stub_lib: Path,
                                                                                  tmp_path: Path) -> None:
    """Ranks that count tokens (clusterwatch.train.report(tokens=...)): the batch doubles (10 steps/s of 8192
    tokens, as 20 of 4096 before) for longer than the window that raised the alert in steps/s above, and nothing
    fires; then the sequences halve (10 steps/s of 4096 tokens), the steps/s held, and job_slowdown fires in
    tokens/s against the tokens/s of before."""
    with slowing_job(stub_lib, tmp_path, True, tokens=True) as job:
        assert job.big_file is not None
        _at_speed(job)
        job.big_file.touch()
        job.slow_file.touch()
        _wait(20, "the doubled batch for two windows")
        assert job.firing() is None
        job.big_file.unlink()
        fired = wait_for(job.firing, timeout=90, interval=1.0, what="job_slowdown in tokens/s")
    assert fired["job_id"] == job.job_id, fired
    # "runs 49 % slower than it did in tokens/s: 41.4k tokens/s for 7 s, against a steady 81.9k tokens/s; ..."
    said = re.search(r"runs (\d+) % slower than it did in tokens/s: ([\d.]+)k tokens/s for .+, against a steady "
                     r"([\d.]+)k tokens/s", fired["description"])
    assert said is not None, fired
    drop, now, baseline = (float(x) for x in said.groups())
    assert baseline == pytest.approx(20 * 4.096, rel=0.2) and drop == pytest.approx(50, abs=15), fired
    assert now == pytest.approx(baseline * (1 - drop / 100), rel=0.1), fired
