"""The agents' token lives in a file only root (or the collector's user) may read, never in the config file every
user reads: a readable config holding a token is refused in one line, and so is a token file open to others."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterwatch.config import load_default_map
from clusterwatch.errors import ConfigError
from tests.services.procs import free_port, stop_pid
from tests.support.helpers import CLI, clean_environ, metric_value, wait_for

TOKEN = "a" * 64


def token_file(tmp_path: Path, name: str = "token", mode: int = 0o600, text: str = TOKEN + "\n") -> Path:
    path = tmp_path / name
    path.write_text(text)
    path.chmod(mode)
    return path


def env() -> dict[str, str]:
    return {k: v for k, v in clean_environ().items() if k not in ("CLUSTERWATCH_TOKEN", "CLUSTERWATCH_TOKEN_FILE")}


def one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    return lines[-1]


def test_a_config_others_may_read_that_holds_a_token_is_refused_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'[agent]\ncollector = "127.0.0.1:1"\ntoken = "{TOKEN}"\n[cli]\ncollector = "127.0.0.1:1"\n')
    config.chmod(0o644)
    with pytest.raises(ConfigError) as err:
        load_default_map(str(config))
    assert "[agent] token" in str(err.value) and "token file" in str(err.value) and TOKEN not in str(err.value)
    done = subprocess.run([*CLI, "--config", str(config), "status", "1"], env=env(), capture_output=True, text=True,
                          timeout=60)
    line = one_line(done)
    assert "move the token into a token file" in line and TOKEN not in done.stderr
    config.chmod(0o600)  # root's own file (a collector host's): taken
    assert load_default_map(str(config))["agent"]["token"] == TOKEN
    config.write_text('[agent]\ntoken_file = "/etc/clusterwatch/token"\n')
    config.chmod(0o644)  # a path is no secret
    assert load_default_map(str(config))["agent"]["token_file"] == "/etc/clusterwatch/token"


@pytest.mark.parametrize("mode, says", [(0o644, "chmod 600"), (0o640, "chmod 600"), (0o600, None)])
def test_a_token_file_others_may_read_is_refused_in_one_line(tmp_path: Path, mode: int, says: str | None) -> None:
    path = token_file(tmp_path, mode=mode)
    done = subprocess.run([*CLI, "agent", "--once", "--json", "--gpu-source", "none", "--token-file", str(path),
                           "--spool-dir", str(tmp_path / "spool")], env=env(), capture_output=True, text=True,
                          timeout=60)
    if says is None:
        assert done.returncode == 0, done.stderr[-2000:]
    else:
        line = one_line(done)
        assert str(path) in line and says in line and TOKEN not in done.stderr


def test_token_and_token_file_together_are_one_line(tmp_path: Path) -> None:
    path = token_file(tmp_path)
    done = subprocess.run([*CLI, "collector", "--token", "x", "--token-file", str(path), "--listen", "127.0.0.1:0",
                           "--metrics-listen", "127.0.0.1:0", "--db", str(tmp_path / "cw.db")], env=env(),
                          capture_output=True, text=True, timeout=60)
    assert "given twice" in one_line(done)


def start_collector(tmp_path: Path, path: Path) -> tuple[subprocess.Popen, dict]:
    ports_file = tmp_path / "ports.json"
    log = open(tmp_path / "collector.log", "w")
    proc = subprocess.Popen([*CLI, "collector", "--token-file", str(path), "--listen", "127.0.0.1:0",
                             "--metrics-listen", "127.0.0.1:0", "--web-listen", "none", "--query-auth", "none",
                             "--db", str(tmp_path / "cw.db"), "--ports-file", str(ports_file)],
                            env=env(), stdout=log, stderr=subprocess.STDOUT)
    wait_for(lambda: ports_file.exists() or proc.poll() is not None, what="collector ports")
    assert proc.poll() is None, (tmp_path / "collector.log").read_text()
    return proc, json.loads(ports_file.read_text())


def metrics(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def test_agent_and_collector_take_the_token_from_their_token_files(tmp_path: Path) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    collector, ports = start_collector(tmp_path, token_file(tmp_path, "collector-token"))
    agents = []
    try:
        address = f"127.0.0.1:{ports['grpc']}"
        for name, path in (("good", token_file(tmp_path, "agent-token")),
                           ("bad", token_file(tmp_path, "wrong-token", text="b" * 64 + "\n"))):
            agents.append(subprocess.Popen(
                [*CLI, "agent", "--collector", address, "--node", f"tf-{name}", "--gpu-source", "none",
                 "--interval", "0.3", "--send-interval", "0", "--pid", str(sleeper.pid), "--job-id", f"tf-{name}",
                 "--no-provenance", "--kmsg", "none", "--token-file", str(path), "--spool-dir",
                 str(tmp_path / f"spool-{name}"), "--train-socket", str(tmp_path / f"{name}.sock")],
                env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_for(lambda: (metric_value(metrics(ports["metrics"]), "clusterwatch_ingest_samples_total") or 0) > 0
                 and (metric_value(metrics(ports["metrics"]), "clusterwatch_ingest_unauthenticated_total") or 0) > 0,
                 what="the good agent's samples and the bad agent refused")
    finally:
        for p in (*agents, collector):
            if p.poll() is None:
                stop_pid(p.pid, grace=15.0)
        sleeper.kill()
        sleeper.wait()


@pytest.mark.serial  # the prolog gives up after 0.9 s by design: load would make it give up
def test_a_prolog_hands_the_token_files_token_to_the_agent_it_starts(tmp_path: Path) -> None:
    path = token_file(tmp_path)
    config = tmp_path / "config.toml"
    config.write_text(f'[agent]\ntoken_file = "{path}"\ncollector = "127.0.0.1:{free_port()}"\n'
                      'gpu_source = "none"\n')
    config.chmod(0o644)
    spool = tmp_path / "spool"
    hook_env = {**env(), "CLUSTERWATCH_CONFIG": str(config), "SLURM_JOB_ID": "4244", "SLURM_JOB_UID": "0",
                "SLURM_JOB_USER": "root", "SLURMD_NODENAME": "tf1", "CLUSTERWATCH_SPOOL": f"{spool}/{{node}}"}
    done = subprocess.run([*CLI, "prolog"], env=hook_env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    pid_file = spool / "tf1" / "agent.pid"
    wait_for(lambda: pid_file.exists(), what="the agent's pid file")
    pid = int(pid_file.read_text())
    try:
        environ = dict(e.split(b"=", 1) for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in e)
        assert environ[b"CLUSTERWATCH_TOKEN"] == TOKEN.encode() and b"CLUSTERWATCH_TOKEN_FILE" not in environ
        assert os.stat(f"/proc/{pid}/environ").st_uid == 0  # root's alone to read
        assert TOKEN.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    finally:
        stop_pid(pid, grace=15.0)
        time.sleep(0.1)
