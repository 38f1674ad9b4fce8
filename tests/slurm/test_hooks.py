"""`clusterwatch prolog`/`epilog` as slurmd runs them: real processes, collector down, agent missing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clusterwatch.agent.ensure import EnsureResult, agent_alive, claim_spool, ensure_agent, read_pid, spool_claimed
from clusterwatch.agent.spool import resolve_gpus, spool_dir_for
from clusterwatch.cli.hooks_cmd import exit_code_from

from bench.waiting import poll_until
from clusterwatch.model import GpuInfo
from tests.services.procs import free_port, pid_alive, stop_pid
from tests.support.helpers import CLI, ROOT


def hook_env(spool: Path, **extra: str) -> dict[str, str]:
    """What slurmd gives a Prolog (no PATH), plus where the agent reports: a port nothing listens on."""
    env = {
        "SLURM_JOB_ID": "4242", "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_USER": "alice",
        "SLURMD_NODENAME": "hk1", "SLURM_JOB_GPUS": "0,1", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
        "CLUSTERWATCH_SPOOL": f"{spool}/{{node}}", "CLUSTERWATCH_COLLECTOR": f"127.0.0.1:{free_port()}",
        "CLUSTERWATCH_GPU_SOURCE": "none",
    }
    env.update(extra)
    return env


# The design's second is the hook's own work (cut at HOOK_DEADLINE_S from inside). Measured from outside,
# the time also holds Python's start and the imports, which alone have passed a second on a loaded 2-core
# test machine; a hook that waits past its deadline (the agent lock's 5 s wait) still shows above this.
HOOK_WALL_BOUND_S = 4.0


def run_hook(kind: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    proc = subprocess.run([*CLI, kind], env=env, capture_output=True, text=True, timeout=10)
    return proc, time.monotonic() - start


def agents_of(spool: Path) -> list[int]:
    """Pids of the agents whose command line names this spool (only ours: the folder is our tmp_path)."""
    marker = os.fsencode(str(spool))
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"agent" in argv and any(marker in a for a in argv) and pid_alive(int(entry.name)):
                found.append(int(entry.name))
    return found


@pytest.fixture
def spool(tmp_path: Path):
    root = tmp_path / "spool"
    yield root
    # Stop the agents the prologs started, by the pid in each pid file (they wait up to 5 s to flush).
    for pid_file in root.glob("*/agent.pid"):
        pid = read_pid(str(pid_file))
        if pid is not None and agent_alive(pid, str(pid_file.parent)):
            stop_pid(pid, grace=15.0)
    assert not agents_of(root)


@pytest.mark.serial  # the hook gives up after 0.9 s by design (Slurm must not wait): load makes it give up
def test_prolog_with_collector_down_and_no_agent_returns_0_fast_and_starts_the_agent(spool: Path) -> None:
    proc, took = run_hook("prolog", hook_env(spool))
    assert proc.returncode == 0, proc.stderr
    assert took < HOOK_WALL_BOUND_S
    assert proc.stderr == ""
    node_dir = spool / "hk1"
    events = list((node_dir / "events").glob("*.json"))
    assert len(events) == 1
    doc = json.loads(events[0].read_text())
    assert doc == {**doc, "kind": "start", "job_id": "4242", "user": "alice", "gpu_indexes": "0,1"}
    pid = read_pid(str(node_dir / "agent.pid"))
    assert pid is not None and agent_alive(pid, str(node_dir))
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert b"--node" in argv and b"hk1" in argv
    # The agent must not carry the job's variables: it would count itself as the job's process.
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert not [v for v in environ if v.startswith((b"SLURM_", b"SLURMD_"))]
    assert os.getsid(pid) == pid  # its own session: slurmd killing the prolog's group leaves it alone
    # A second prolog finds it running and starts nothing.
    again, took = run_hook("prolog", hook_env(spool, SLURM_JOB_ID="4243"))
    assert again.returncode == 0 and took < HOOK_WALL_BOUND_S
    assert agents_of(spool) == [pid]


@pytest.mark.serial  # the hook gives up after 0.9 s by design (Slurm must not wait): load makes it give up
def test_two_prologs_at_once_start_one_agent(spool: Path) -> None:
    env = hook_env(spool)
    procs = [subprocess.Popen([*CLI, "prolog"], env=dict(env, SLURM_JOB_ID=str(100 + i)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(4)]
    for p in procs:
        assert p.wait(timeout=10) == 0
        # each wrote its event (the agent the first one started may already have taken some: not counted)
        assert b"cannot" not in p.stderr.read()
    poll_until(lambda: len(agents_of(spool)) >= 1, 5.0)
    time.sleep(0.5)  # a second agent, if one were started, would show by now
    assert agents_of(spool) == [read_pid(str(spool / "hk1" / "agent.pid"))]


@pytest.mark.serial  # the hook gives up after 0.9 s by design (Slurm must not wait): load makes it give up
def test_epilog_with_an_unwritable_spool_returns_0(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    env = hook_env(blocker, SLURM_JOB_EXIT_CODE2="0:0", SLURM_SCRIPT_CONTEXT="epilog_slurmd")
    proc, took = run_hook("epilog", env)
    assert proc.returncode == 0
    assert took < HOOK_WALL_BOUND_S
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "cannot write its event" in lines[0], proc.stderr


@pytest.mark.serial  # the hook gives up after 0.9 s by design (Slurm must not wait): load makes it give up
def test_prolog_with_an_unwritable_spool_returns_0_and_starts_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    proc, took = run_hook("prolog", hook_env(blocker))
    assert proc.returncode == 0 and took < HOOK_WALL_BOUND_S
    assert len(proc.stderr.splitlines()) == 2  # the event, then the agent: one line each
    assert not agents_of(blocker)


@pytest.mark.serial  # the hook gives up after 0.9 s by design (Slurm must not wait): load makes it give up
@pytest.mark.parametrize("kind", ["prolog", "epilog"])
@pytest.mark.parametrize("garbage", [
    {"SLURM_JOB_ID": "12; rm -rf /"},
    {"SLURM_JOB_ID": ""},
    {"SLURM_JOB_ID": "9" * 40},
])
def test_garbage_environment_exits_0_with_one_line(tmp_path: Path, kind: str, garbage: dict[str, str]) -> None:
    env = hook_env(tmp_path / "spool", SLURM_JOB_UID="-1", SLURM_JOB_EXIT_CODE2="x:y",
                   CLUSTERWATCH_GPU_SOURCE="bogus", CLUSTERWATCH_INTERVAL="often", **garbage)
    proc, took = run_hook(kind, env)
    assert proc.returncode == 0
    assert took < HOOK_WALL_BOUND_S
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "SLURM_JOB_ID" in proc.stderr
    assert not (tmp_path / "spool").exists()


@pytest.mark.serial  # the hook gives up after 0.9 s by design (Slurm must not wait): load makes it give up
@pytest.mark.parametrize("setting, said", [
    ({"CLUSTERWATCH_GPU_SOURCE": "bogus"}, "gpu source 'bogus' is not auto, nvml, sim or none"),
    ({"CLUSTERWATCH_INTERVAL": "often"}, "interval 'often' is not a number of seconds"),
])
def test_bad_agent_settings_say_so_and_exit_0(tmp_path: Path, setting: dict[str, str], said: str) -> None:
    proc, _ = run_hook("prolog", hook_env(tmp_path / "spool", **setting))
    assert proc.returncode == 0
    assert said in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert len(list((tmp_path / "spool" / "hk1" / "events").glob("*.json"))) == 1  # the event still went
    assert not agents_of(tmp_path / "spool")


@pytest.mark.serial  # the hook gives up after 0.9 s by design (Slurm must not wait): load makes it give up
def test_epilog_writes_the_exit_code(tmp_path: Path) -> None:
    env = hook_env(tmp_path / "spool", SLURM_JOB_EXIT_CODE2="3:0", SLURM_SCRIPT_CONTEXT="epilog_slurmd")
    proc, _ = run_hook("epilog", env)
    assert proc.returncode == 0 and proc.stderr == ""
    (event,) = (tmp_path / "spool" / "hk1" / "events").glob("*.json")
    doc = json.loads(event.read_text())
    assert (doc["kind"], doc["job_id"], doc["exit_code"]) == ("end", "4242", 3)
    assert not agents_of(tmp_path / "spool")  # the epilog never starts an agent


def test_hooks_import_neither_grpc_nor_psutil(tmp_path: Path) -> None:
    env = dict(hook_env(tmp_path / "spool"), CLUSTERWATCH_COLLECTOR="")
    proc = subprocess.run([CLI[0], "-X", "importtime", *CLI[1:], "prolog"], env=env, capture_output=True,
                          text=True, timeout=10)
    assert proc.returncode == 0
    modules = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time")}
    assert "clusterwatch.agent.spool" in modules  # the hook ran (lines after os._exit may be lost)
    assert not {m for m in modules if m.split(".")[0] in ("grpc", "psutil", "asyncio")}


def test_agent_ensure_starts_once(spool: Path) -> None:
    env = {**os.environ, "CLUSTERWATCH_SPOOL": f"{spool}/{{node}}"}
    collector = f"127.0.0.1:{free_port()}"
    args = [*CLI, "agent", "--ensure", "--collector", collector, "--node", "ens1", "--gpu-source", "none"]
    first = subprocess.run(args, env=env, capture_output=True, text=True, timeout=10)
    second = subprocess.run(args, env=env, capture_output=True, text=True, timeout=10)
    assert first.returncode == 0 and second.returncode == 0
    pid = read_pid(str(spool / "ens1" / "agent.pid"))
    assert first.stdout.strip() == f"agent of ens1 started, pid {pid}"
    assert second.stdout.strip() == f"agent of ens1 running, pid {pid}"
    assert agents_of(spool) == [pid]


def test_a_second_agent_for_the_same_spool_exits_with_one_line(spool: Path) -> None:
    collector = f"127.0.0.1:{free_port()}"
    args = [*CLI, "agent", "--collector", collector, "--node", "dup1", "--gpu-source", "none",
            "--spool-dir", str(spool / "dup1"), "--train-socket", str(spool / "dup1.sock")]
    first = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        poll_until(lambda: read_pid(str(spool / "dup1" / "agent.pid")) == first.pid, 20.0)
        second = subprocess.run(args, capture_output=True, text=True, timeout=30)
        assert second.returncode == 1
        assert second.stderr.strip().splitlines()[-1] == (
            f"clusterwatch: another agent runs for {spool / 'dup1'} (pid {first.pid}); this one exits, so the "
            "node is not sampled twice")
        assert first.poll() is None and read_pid(str(spool / "dup1" / "agent.pid")) == first.pid
    finally:
        stop_pid(first.pid, grace=15.0)
        first.wait(timeout=20)


def test_ensure_counts_an_agent_that_holds_the_spool_without_a_pid_file(tmp_path: Path) -> None:
    # A hook cut off by its deadline between starting the agent and writing its pid: the next hook must
    # not start a second one.
    folder = tmp_path / "spool"
    fd = claim_spool(str(folder))  # this test process stands for that agent
    assert fd is not None
    try:
        assert claim_spool(str(folder)) is None  # a second claim fails while the first is held
        ran = tmp_path / "ran"
        result = ensure_agent(str(folder), ["/bin/sh", "-c", f"touch {ran}"], {"PATH": "/usr/bin:/bin"})
        assert result == EnsureResult("running", None)
        time.sleep(0.3)
        assert not ran.exists()
    finally:
        os.close(fd)
    assert not spool_claimed(str(folder))  # the kernel let go with the descriptor


def test_exit_codes_from_the_epilog_environment() -> None:
    assert exit_code_from({"SLURM_JOB_EXIT_CODE2": "0:0"}) == 0
    assert exit_code_from({"SLURM_JOB_EXIT_CODE2": "2:0"}) == 2
    assert exit_code_from({"SLURM_JOB_EXIT_CODE2": "0:9"}) == 137
    assert exit_code_from({"SLURM_JOB_EXIT_CODE": "256"}) == 1
    assert exit_code_from({"SLURM_JOB_EXIT_CODE": "15"}) == 143
    assert exit_code_from({"SLURM_JOB_EXIT_CODE2": "x"}) is None
    assert exit_code_from({}) is None


def test_spool_folders_and_gpu_uuids() -> None:
    assert spool_dir_for(None, "n7") == "/run/clusterwatch/n7"
    assert spool_dir_for("/var/spool/cw/{node}", "n7") == "/var/spool/cw/n7"
    assert spool_dir_for("/srv/cw", "n7") == "/srv/cw"
    inventory = [GpuInfo("GPU-aaaa-1", 0, "x", 1), GpuInfo("GPU-bbbb-2", 1, "x", 1), GpuInfo("GPU-bbbc-3", 2, "x", 1)]
    assert resolve_gpus("1,0", inventory) == ("GPU-bbbb-2", "GPU-aaaa-1")
    assert resolve_gpus("GPU-aaaa,GPU-bbb,7,", inventory) == ("GPU-aaaa-1",)  # ambiguous and unknown dropped
    assert resolve_gpus("", inventory) == ()


SLURM_DEPLOY = ROOT / "deploy"
DOCS = ROOT / "docs"


def _script_default(name: str) -> str:
    text = (SLURM_DEPLOY / "slurm" / name).read_text()
    (line,) = [x for x in text.splitlines() if x.startswith("CLUSTERWATCH=${CLUSTERWATCH:-")]
    return line[len("CLUSTERWATCH=${CLUSTERWATCH:-"):-1]


def test_hooks_units_and_docs_name_one_install_path() -> None:
    units = {line.split("=", 1)[1].split()[0] for unit in (SLURM_DEPLOY / "systemd").glob("*.service")
             for line in unit.read_text().splitlines() if line.startswith("ExecStart=")}
    hooks = {_script_default("prolog.sh"), _script_default("epilog.sh")}
    assert len(units) == 1 and hooks == units, (hooks, units)
    (path,) = units
    venv = path.removesuffix("/bin/clusterwatch")
    assert f"python3 -m venv {venv}" in (DOCS / "how-to" / "install-on-slurm.md").read_text()
    assert f"python3 -m venv {venv} " in (SLURM_DEPLOY / "slurm" / "README.md").read_text()


def _run_script(name: str, tmp_path: Path, hooks_env: str, **extra: str) -> subprocess.CompletedProcess:
    """The shipped script as slurmd runs it: no PATH, the job's variables, our own hooks.env and log folder."""
    env_file = tmp_path / "hooks.env"
    env_file.write_text(hooks_env)
    env = dict(hook_env(tmp_path / "spool", SLURM_SCRIPT_CONTEXT=f"{name}_slurmd", SLURM_JOB_EXIT_CODE2="0:0"),
               CLUSTERWATCH_HOOKS_ENV=str(env_file), CLUSTERWATCH_HOOK_LOG_DIR=str(tmp_path / "log"), **extra)
    return subprocess.run(["/bin/sh", str(SLURM_DEPLOY / "slurm" / f"{name}.sh")], env=env, capture_output=True,
                          text=True, timeout=10)


@pytest.mark.serial  # times the hook against its 1 s budget (under 1.5 s): load would stretch it
@pytest.mark.parametrize("name", ["prolog", "epilog"])
def test_a_hook_that_cannot_find_clusterwatch_says_so_and_exits_0(tmp_path: Path, name: str) -> None:
    missing = tmp_path / "nowhere" / "bin" / "clusterwatch"
    start = time.monotonic()
    proc = _run_script(name, tmp_path, f"CLUSTERWATCH={missing}\n")
    assert proc.returncode == 0 and time.monotonic() - start < 1.5
    assert f"clusterwatch {name}: {missing} is missing or not executable" in proc.stderr
    assert "job 4242" in proc.stderr
    assert proc.stderr.strip() in (tmp_path / "log" / "hooks-hk1.log").read_text()


def test_the_shipped_epilog_runs_the_program_hooks_env_names(tmp_path: Path) -> None:
    program = Path(sys.executable).parent / "clusterwatch"
    proc = _run_script("epilog", tmp_path, f"CLUSTERWATCH={program}\n")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    (event,) = (tmp_path / "spool" / "hk1" / "events").glob("*.json")
    assert json.loads(event.read_text())["kind"] == "end"
