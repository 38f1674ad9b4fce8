"""The simulated GPU source, with real child processes that opt in through their environment."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from clusterwatch.agent.agent import Agent
from clusterwatch.agent.backends.new_pids import NewPids
from clusterwatch.agent.backends.procs import ProcSource
from clusterwatch.agent.backends.sim import SimGpuSource, SimSpec, open_sim_source, parse_sim_environ
from clusterwatch.agent.backends.sim_scenario import KINDS, MiB, parse_scenario
from clusterwatch.agent.config import AgentConfig
from clusterwatch.agent.labels import JobLabeler

from clusterwatch.errors import ConfigError
from clusterwatch.model import GpuUse
from tests.support.helpers import CLI, SIM_RUN, clean_environ, cli, popen_exec_done

SCENARIO = """
[gpus]
count = 2
name = "Test GPU"
memory_mib = 16384
base_memory_mib = 100
idle_power_watts = 50
max_power_watts = 250

[defaults]
profile = "steady"

[profiles.steady]
kind = "steady"
memory_mib = 2048
utilization = 60

[profiles.leak]
kind = "linear_leak"
memory_mib = 1000
leak_mib_per_min = 60
utilization = 50
noise = 10

[profiles.stalled]
kind = "stall"
memory_mib = 3000
utilization = 90
stall_after_s = 100
"""

SLEEP = shutil.which("sleep") or "/bin/sleep"


@pytest.fixture
def scenario_file(tmp_path: Path) -> str:
    path = tmp_path / "scenario.toml"
    path.write_text(SCENARIO)
    return str(path)


def sim_env(**env: str) -> dict[str, str]:
    """A child's environment: no CLUSTERWATCH_* of the caller's, this session's run, then `env`."""
    return {**clean_environ(), "CLUSTERWATCH_SIM_RUN": SIM_RUN, **env}


def ours(path: str | None, *, node: str | None = None) -> SimGpuSource:
    """A source of this session's run: it plays our children, never a process of another run on the host."""
    return open_sim_source(path, node=node, run=SIM_RUN)


@pytest.fixture
def spawn() -> Iterator:
    """Start real child processes with CLUSTERWATCH_SIM_* in their environment (this session's run unless a
    test names another); stop them after."""
    children: list[subprocess.Popen] = []

    def start(**env: str) -> subprocess.Popen:
        child = popen_exec_done([SLEEP, "300"], env=sim_env(**env))
        children.append(child)
        return child

    yield start
    for child in children:
        child.kill()
    for child in children:
        child.wait()


class CountingSim(SimGpuSource):
    """Records whose environment was read: other processes come and go on a shared host."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.inspected: Counter[int] = Counter()

    def _inspect(self, pid: int, start_ticks: int):
        self.inspected[pid] += 1
        return super()._inspect(pid, start_ticks)


def counting(path: str | None, node: str = "n1") -> CountingSim:
    return CountingSim(open_sim_source(path, node=node).scenario, node=node, run=SIM_RUN)


def start_time(pid: int) -> float:
    return psutil.Process(pid).create_time()


def test_a_real_process_follows_its_profile_over_simulated_time(scenario_file: str, spawn) -> None:
    src = counting(scenario_file)
    gpu0, gpu1 = src.inventory()
    leaky = spawn(CLUSTERWATCH_SIM_GPU="1", CLUSTERWATCH_SIM_PROFILE="leak")
    plain = spawn(CLUSTERWATCH_SIM_GPU="0")  # no profile: the default, steady
    bystander = spawn()
    t0 = start_time(leaky.pid)
    memory = []
    for minutes in (0, 1, 10, 60):
        poll = src.poll(t0 + 60 * minutes)
        assert poll.errors == 0
        assert bystander.pid not in poll.processes
        [use] = poll.processes[leaky.pid]
        assert use.gpu_uuid == gpu1.uuid
        # 1000 MiB at start, 60 MiB more a minute (1 MiB of slack: start time to the tick)
        assert abs(use.used_memory_bytes - (1000 + 60 * minutes) * MiB) <= MiB
        assert 40.0 <= use.sm_utilization <= 60.0
        memory.append(use.used_memory_bytes)
        assert poll.processes[plain.pid] == [GpuUse(gpu0.uuid, 2048 * MiB, 60.0)]
        readings = {r.uuid: r for r in poll.readings}
        assert readings[gpu1.uuid].memory_used_bytes == 100 * MiB + use.used_memory_bytes
        assert readings[gpu1.uuid].utilization == use.sm_utilization
        assert readings[gpu1.uuid].power_watts == pytest.approx(50 + 2 * use.sm_utilization, abs=0.1)
        assert readings[gpu0.uuid].memory_used_bytes == (100 + 2048) * MiB
        assert readings[gpu0.uuid].memory_total_bytes == 16384 * MiB
    assert memory == sorted(memory) and memory[-1] > memory[0] + 3000 * MiB
    # The environment of each process was read once, not once per poll.
    assert [src.inspected[c.pid] for c in (leaky, plain, bystander)] == [1, 1, 1]


def test_the_same_time_reads_the_same_values(scenario_file: str, spawn) -> None:
    child = spawn(CLUSTERWATCH_SIM_GPU="0", CLUSTERWATCH_SIM_PROFILE="leak")
    t = start_time(child.pid) + 123.4
    a = ours(scenario_file, node="n1").poll(t)
    b = ours(scenario_file, node="n1").poll(t)
    assert a.processes[child.pid] == b.processes[child.pid]
    # Noise moves from second to second, within ±10 %.
    src = ours(scenario_file, node="n1")
    utils = {src.poll(t + s).processes[child.pid][0].sm_utilization for s in range(20)}
    assert len(utils) > 5 and all(40.0 <= u <= 60.0 for u in utils)


def test_readings_kept_between_polls_are_what_a_fresh_source_reads(tmp_path: Path, spawn) -> None:
    """Utilisation (and a flat curve's readings) are kept for the second of life they hold for: polls that
    move back and forth, within a second, across a stall and before the start read what a new source reads."""
    path = tmp_path / "scenario.toml"
    path.write_text(SCENARIO.replace("stall_after_s = 100", "stall_after_s = 100.5"))  # a stall within a second
    kids = [spawn(CLUSTERWATCH_SIM_GPU="0", CLUSTERWATCH_SIM_PROFILE="stalled"),
            spawn(CLUSTERWATCH_SIM_GPU="0,1", CLUSTERWATCH_SIM_PROFILE="leak"), spawn(CLUSTERWATCH_SIM_GPU="1")]
    t0 = start_time(kids[0].pid)
    kept = ours(str(path), node="n1")
    times = [0.0, 0.3, 0.9, 1.0, 1.2, 99.5, 99.99, 100.0, 100.01, 100.6, 99.7, 5.5, 5.1, -3.0, -0.5, 0.2, 3600.0]
    for dt in times + [100.0 + k / 20 for k in range(21)] + [101.0 - k / 20 for k in range(21)]:
        fresh = ours(str(path), node="n1").poll(t0 + dt)
        got = kept.poll(t0 + dt)
        assert {k.pid: got.processes[k.pid] for k in kids} == {k.pid: fresh.processes[k.pid] for k in kids}, dt
        assert got.readings == fresh.readings, dt


def test_a_stalled_process_drops_to_zero_and_the_gpu_to_idle_power(scenario_file: str, spawn) -> None:
    src = ours(scenario_file, node="n1")
    child = spawn(CLUSTERWATCH_SIM_GPU="0", CLUSTERWATCH_SIM_PROFILE="stalled")
    t0 = start_time(child.pid)
    busy, stuck = src.poll(t0 + 50), src.poll(t0 + 150)
    assert busy.processes[child.pid][0].sm_utilization == 90.0
    assert stuck.processes[child.pid] == [GpuUse(src.inventory()[0].uuid, 3000 * MiB, 0.0)]
    assert (stuck.readings[0].utilization, stuck.readings[0].power_watts) == (0.0, 50.0)


def test_memory_file_steers_the_process_memory(scenario_file: str, spawn, tmp_path: Path) -> None:
    mem_file = tmp_path / "gpu-mem"
    src = ours(scenario_file, node="n1")
    child = spawn(CLUSTERWATCH_SIM_GPU="1", CLUSTERWATCH_SIM_GPU_MEM_FILE=str(mem_file))
    t = start_time(child.pid) + 10
    assert src.poll(t).processes[child.pid][0].used_memory_bytes == 2048 * MiB  # no file yet: the curve
    mem_file.write_text("123456789\n")
    assert src.poll(t).processes[child.pid][0].used_memory_bytes == 123456789
    mem_file.write_text("not a number")
    assert src.poll(t).processes[child.pid][0].used_memory_bytes == 2048 * MiB
    mem_file.write_text(str(10**15))  # more than the GPU has: capped at what is left after the base
    assert src.poll(t).processes[child.pid][0].used_memory_bytes == (16384 - 100) * MiB


def test_memory_file_that_is_a_fifo_does_not_block(scenario_file: str, spawn, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    src = ours(scenario_file, node="n1")
    child = spawn(CLUSTERWATCH_SIM_GPU="0", CLUSTERWATCH_SIM_GPU_MEM_FILE=str(fifo))
    started = time.monotonic()
    poll = src.poll(start_time(child.pid) + 5)
    assert time.monotonic() - started < 10.0  # a blocking read of the FIFO would never return
    assert poll.processes[child.pid][0].used_memory_bytes == 2048 * MiB


def test_base_memory_override_and_node_filter(scenario_file: str, spawn) -> None:
    mine = spawn(CLUSTERWATCH_SIM_GPU="0", CLUSTERWATCH_SIM_GPU_BASE_MB="512", CLUSTERWATCH_SIM_NODE="n1")
    theirs = spawn(CLUSTERWATCH_SIM_GPU="0", CLUSTERWATCH_SIM_NODE="n2")
    poll = ours(scenario_file, node="n1").poll(start_time(mine.pid) + 1)
    assert poll.processes[mine.pid][0].used_memory_bytes == 512 * MiB
    assert theirs.pid not in poll.processes
    other = ours(scenario_file, node="n2")
    assert theirs.pid in other.poll(start_time(theirs.pid) + 1).processes
    # Two simulated nodes on one host have different GPU UUIDs.
    n1_uuids = {g.uuid for g in ours(None, node="n1").inventory()}
    assert n1_uuids.isdisjoint(g.uuid for g in other.inventory())


def test_only_the_processes_of_its_own_run_are_played(scenario_file: str, spawn) -> None:
    # Processes of other runs on the same host (another test session, a demo, a benchmark), one of them
    # with a value this scenario cannot play: none is played, and no mistake of theirs is counted here.
    mine = spawn(CLUSTERWATCH_SIM_GPU="0")
    theirs = spawn(CLUSTERWATCH_SIM_GPU="0", CLUSTERWATCH_SIM_RUN="another-run")
    spawn(CLUSTERWATCH_SIM_GPU="zero", CLUSTERWATCH_SIM_RUN="another-run")
    unmarked = spawn(CLUSTERWATCH_SIM_GPU="1", CLUSTERWATCH_SIM_RUN="")
    now = start_time(mine.pid) + 1
    poll = ours(scenario_file, node="n1").poll(now)
    assert (poll.errors, set(poll.processes)) == (0, {mine.pid})
    assert poll.readings[0].memory_used_bytes == (100 + 2048) * MiB  # the GPU holds ours alone
    other = open_sim_source(scenario_file, node="n1", run="another-run").poll(now)
    assert (other.errors, set(other.processes)) == (1, {theirs.pid})
    # A source given no run (docker-compose, a plain `clusterwatch agent`) plays only processes without one.
    plain = open_sim_source(scenario_file, node="n1").poll(now)
    assert unmarked.pid in plain.processes and not {mine.pid, theirs.pid} & set(plain.processes)


def test_a_real_agent_plays_the_run_it_is_given(tmp_path: Path, spawn) -> None:
    mine = spawn(CLUSTERWATCH_SIM_GPU="0", CLUSTERWATCH_SIM_NODE="run-node")
    theirs = spawn(CLUSTERWATCH_SIM_GPU="1", CLUSTERWATCH_SIM_NODE="run-node", CLUSTERWATCH_SIM_RUN="another-run")
    args = [*CLI, "agent", "--once", "--json", "--gpu-source", "sim", "--node", "run-node",
            "--spool-dir", str(tmp_path / "spool"), "--train-socket", str(tmp_path / "train.sock")]
    flag = subprocess.run([*args, "--sim-run", SIM_RUN], env=clean_environ(), capture_output=True, text=True,
                          timeout=60)
    variable = subprocess.run(args, env=sim_env(), capture_output=True, text=True, timeout=60)
    for out in (flag, variable):
        assert out.returncode == 0, out.stderr
        on_gpus = {p["pid"] for p in json.loads(out.stdout)["batch"]["processes"] if p.get("gpus")}
        assert mine.pid in on_gpus and theirs.pid not in on_gpus, out.stdout[:2000]


def test_run_plays_its_own_command_only(spawn) -> None:
    # `clusterwatch run --gpu-source sim`: the command asks for simulated GPU 0; so does a process of no run
    # beside it, with 50 GB. Only the command is played: the GPU's peak is the scenario's base plus 1000 MiB.
    spawn(CLUSTERWATCH_SIM_GPU="0", CLUSTERWATCH_SIM_GPU_BASE_MB="50000", CLUSTERWATCH_SIM_RUN="")
    r = cli("run", "--interval", "0.5", "--gpu-source", "sim", "--json", "--", sys.executable, "-c",
            "import time; time.sleep(3)", env={"CLUSTERWATCH_SIM_GPU": "0", "CLUSTERWATCH_SIM_GPU_BASE_MB": "1000"},
            timeout=90)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    [gpu0] = [g for g in report["gpus"] if g["index"] == 0]
    base = open_sim_source(None).scenario.gpus.base_memory_bytes
    assert int(gpu0["memory_peak_bytes"]) == base + 1000 * MiB, gpu0
    assert [int(p["gpu_memory_bytes"]) for p in report["processes"]] == [1000 * MiB]


def test_an_exited_process_is_gone_at_the_next_poll(scenario_file: str, spawn) -> None:
    src = ours(scenario_file, node="n1")
    child = spawn(CLUSTERWATCH_SIM_GPU="0")
    now = start_time(child.pid) + 1
    assert child.pid in src.poll(now).processes
    child.kill()
    child.wait()
    poll = src.poll(now + 5)
    assert child.pid not in poll.processes
    assert poll.readings[0].memory_used_bytes == 100 * MiB
    assert poll.readings[0].utilization == 0.0


def test_a_bad_environment_is_counted_once(scenario_file: str, spawn) -> None:
    src = ours(scenario_file, node="n1")
    spawn(CLUSTERWATCH_SIM_GPU="7")  # the scenario has 2 GPUs
    spawn(CLUSTERWATCH_SIM_GPU="0", CLUSTERWATCH_SIM_PROFILE="no-such-profile")
    spawn(CLUSTERWATCH_SIM_GPU="zero")
    first = src.poll(time.time())
    assert (first.errors, first.processes) == (3, {})
    assert src.poll(time.time()).errors == 0


@pytest.mark.parametrize(
    ("data", "spec"),
    [
        (b"PATH=/bin\0HOME=/root\0", None),
        (b"CLUSTERWATCH_SIM_GPU=\0", None),
        (b"CLUSTERWATCH_SIM_GPU=3\0", SimSpec((3,))),
        (
            b"A=1\0CLUSTERWATCH_SIM_GPU=0,1\0CLUSTERWATCH_SIM_PROFILE=leak\0CLUSTERWATCH_SIM_GPU_BASE_MB=1.5\0"
            b"CLUSTERWATCH_SIM_GPU_MEM_FILE=/tmp/m\0CLUSTERWATCH_SIM_NODE=n2\0",
            SimSpec((0, 1), "leak", 1.5, "/tmp/m", "n2"),
        ),
        (b"X_CLUSTERWATCH_SIM_GPU=1\0", None),
        (b"CLUSTERWATCH_SIM_GPU=3\0CLUSTERWATCH_SIM_RUN=r1\0", None),  # another run's
        (b"CLUSTERWATCH_SIM_GPU=3\0CLUSTERWATCH_SIM_RUN=\0", SimSpec((3,))),  # empty: no run
    ],
)
def test_parse_sim_environ(data: bytes, spec: SimSpec | None) -> None:
    assert parse_sim_environ(data) == spec


def test_parse_sim_environ_of_a_run() -> None:
    ours_, theirs = b"CLUSTERWATCH_SIM_RUN=r1\0CLUSTERWATCH_SIM_GPU=", b"CLUSTERWATCH_SIM_RUN=r2\0CLUSTERWATCH_SIM_GPU="
    assert parse_sim_environ(ours_ + b"1\0", run="r1") == SimSpec((1,))
    assert parse_sim_environ(b"CLUSTERWATCH_SIM_GPU=1\0", run="r1") is None
    assert parse_sim_environ(theirs + b"zero\0", run="r1") is None  # not ours: not our mistake either
    with pytest.raises(ValueError):
        parse_sim_environ(ours_ + b"zero\0", run="r1")


def test_the_default_scenario_has_every_kind_of_profile() -> None:
    src = ours(None, node="n1")
    assert len(src.inventory()) == 8
    assert {p.kind for p in src.scenario.profiles.values()} == set(KINDS)
    assert src.scenario.default_profile == "steady"


@pytest.mark.parametrize(
    ("kind", "params", "times_s", "mib"),
    [
        ("steady", "", (0, 600), (1000, 1000)),
        ("warmup", "warmup_s = 100", (0, 50, 100, 500), (0, 500, 1000, 1000)),
        ("linear_leak", "leak_mib_per_min = 30", (0, 120, 600), (1000, 1060, 1300)),
        ("stair_leak", "step_mib = 100\nstep_every_s = 60", (0, 59, 60, 185), (1000, 1000, 1100, 1300)),
        ("idle", "", (0, 1000), (1000, 1000)),
        ("sawtooth", "amplitude_mib = 400\nperiod_s = 100", (0, 50, 99, 100), (1000, 1200, 1396, 1000)),
    ],
)
def test_profile_memory_curves(kind: str, params: str, times_s: tuple, mib: tuple) -> None:
    text = f'[profiles.p]\nkind = "{kind}"\nmemory_mib = 1000\n{params}\n'
    profile = parse_scenario(text, "t.toml").profiles["p"]
    assert tuple(profile.memory_at(t) // MiB for t in times_s) == mib


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[gpus\ncount = 2", "line 1: not valid TOML"),
        ('[profiles.x]\nkind = "leek"', "line 2: profiles.x.kind = 'leek' is not one of steady, warmup"),
        ('[profiles.x]\nkind = "steady"\nleak_mib_per_min = 5', "unknown key(s) in [profiles.x] for kind"),
        ('[profiles.x]\nkind = "steady"\nmemory_mib = -1', "profiles.x.memory_mib must be a number >= 0"),
        ('[profiles.x]\nkind = "steady"\nutilization = 140', "line 3: profiles.x.utilization must be 0 to 100"),
        ('[gpus]\ncount = 0\n[profiles.x]\nkind = "idle"', "line 2: gpus.count must be a whole number from 1 to 64"),
        ('[defaults]\nprofile = "y"\n[profiles.x]\nkind = "idle"', "profile = 'y' names no profile"),
        ("[gpus]\ncount = 2", "no [profiles.NAME] table"),
    ],
)
def test_a_malformed_scenario_is_one_line_naming_file_and_problem(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        ours(str(path))
    line = str(info.value)
    assert "\n" not in line
    assert line.startswith(f"scenario {path}: ")
    assert problem in line


def test_a_missing_scenario_file_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        ours(str(missing))
    assert str(info.value) == (
        f"scenario {missing}: cannot read it (No such file or directory); pass an existing TOML file"
    )


def test_poll_cost_stays_low_with_many_processes(spawn) -> None:
    src = counting(None)
    profiles = list(src.scenario.profiles)
    children = [
        spawn(CLUSTERWATCH_SIM_GPU=str(i % 8), CLUSTERWATCH_SIM_PROFILE=profiles[i % len(profiles)])
        for i in range(64)
    ]
    first = src.poll(time.time())
    assert {c.pid for c in children} <= set(first.processes)
    polls = 50
    started = time.process_time()
    for _ in range(polls):
        poll = src.poll(time.time())
    per_poll_ms = (time.process_time() - started) / polls * 1000
    assert len(poll.processes) >= 64
    assert sum(len(uses) for uses in poll.processes.values()) >= 64
    assert all(src.inspected[c.pid] == 1 for c in children)  # read once, then cached
    # A few hundred µs on a laptop; the bound leaves room for a loaded CI machine.
    assert per_poll_ms < 25.0, f"{per_poll_ms:.2f} ms per poll"


THREADS = ("import threading, time\n"
           "for _ in range(4): threading.Thread(target=time.sleep, args=(300,), daemon=True).start()\n"
           "print('ready', flush=True)\ntime.sleep(300)\n")


def test_a_process_started_later_is_found_and_its_threads_are_not_processes(scenario_file: str) -> None:
    src = counting(scenario_file)
    first = src.poll(time.time())
    assert first.errors == 0
    child = subprocess.Popen([sys.executable, "-c", THREADS], env=sim_env(CLUSTERWATCH_SIM_GPU="1"),
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        tids = {int(t) for t in os.listdir(f"/proc/{child.pid}/task")} - {child.pid}
        assert len(tids) == 4
        poll = src.poll(time.time())
        assert list(poll.processes) == [child.pid]  # the threads share its environment, but are not processes
        assert src.inspected[child.pid] == 1 and not tids & set(src.inspected)
        assert src.poll(time.time()).processes.keys() == {child.pid}
        assert src.inspected[child.pid] == 1  # read once
    finally:
        child.kill()
        child.wait()
    assert src.poll(time.time()).processes == {}


PARENT = ("import os, subprocess, sys, time\n"
          "env = {k: v for k, v in os.environ.items() if k != 'CLUSTERWATCH_SIM_GPU'}\n"  # the child uses no GPU
          "p = subprocess.Popen(['sleep', '300'], env=env)\n"
          "print(p.pid, flush=True)\ntime.sleep(300)\n")


def test_an_agent_s_two_sources_share_one_look_for_new_processes(scenario_file: str, tmp_path: Path) -> None:
    """The simulated GPUs and the /proc tree find new processes through one NewPids, read once a poll:
    a process started between polls is found by both, as a GPU user and with its child in its tree."""
    procs = ProcSource("n1")
    agent = Agent(AgentConfig(collector=None, node="n1", spool_dir=str(tmp_path)),
                  ours(scenario_file, node="n1"), procs, JobLabeler({}))
    assert agent.gpus._news is procs.new_pids  # (the simulator gave up its own)
    agent.poll()
    reads = []
    last_pid = procs.new_pids._last_pid
    procs.new_pids._last_pid = lambda: reads.append(1) or last_pid()
    parent = subprocess.Popen([sys.executable, "-c", PARENT], env=sim_env(CLUSTERWATCH_SIM_GPU="1"),
                              stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        _, samples = agent.poll()
        assert len(reads) == 1  # one read of /proc/loadavg for both sources
        by_pid = {s.pid: s for s in samples}
        assert by_pid[parent.pid].gpus[0].gpu_uuid == agent.inventory[1].uuid
        assert by_pid[child].ppid == parent.pid and by_pid[child].gpus == ()
    finally:
        os.kill(child, signal.SIGKILL)
        parent.kill()
        parent.wait()


def test_a_shared_new_pids_answers_once_a_round() -> None:
    news = NewPids(full_every=1000)
    news.new_round()
    assert news.poll() is None and news.poll() is None  # the baseline listing, answered twice
    news.new_round()
    news.poll()
    child = subprocess.Popen(["sleep", "300"])
    try:
        assert child.pid not in news.poll()  # the round's answer, read before it started
        news.new_round()
        assert child.pid in news.poll()
        assert child.pid in news.poll()  # a second source in the same round sees it too
    finally:
        child.kill()
        child.wait()
