"""The shipped systemd units and their environment file, checked the way an operator would use them.

`systemd-analyze verify` reads each unit as systemd would (it exits 0 even for keys it ignores, so any
word it prints fails the test); every variable of clusterwatch.env must be one the collector or the agent
reads (a misspelt one would be ignored without a word); and the two commands the units run start from
that file alone, the agent reaching the collector with the file's token.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import click
from clusterwatch.cli.main import cli as cli_group

from tests.support.helpers import CLI, ROOT, left_behind, metric_value, wait_for

UNITS = ROOT / "deploy" / "systemd"
INSTALLED = "/opt/clusterwatch/venv/bin/clusterwatch"  # where the units expect the console script


def _env_file() -> dict[str, str]:
    pairs = {}
    for line in (UNITS / "clusterwatch.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pairs[key] = value
    return pairs


def _verify(paths: list[Path]) -> str:
    out = subprocess.run(["systemd-analyze", "verify", "--man=no", *map(str, paths)], capture_output=True,
                         text=True, timeout=60)
    return (out.stdout + out.stderr).strip() + ("" if out.returncode == 0 else f"\n(exit {out.returncode})")


def test_systemd_analyze_verify_finds_nothing_to_say(tmp_path: Path) -> None:
    script = shutil.which("clusterwatch", path=os.path.dirname(sys.executable))
    assert script, "the clusterwatch console script is not installed beside this python"
    env = tmp_path / "clusterwatch.env"
    shutil.copy(UNITS / "clusterwatch.env", env)
    units = []
    for name in ("clusterwatch-agent.service", "clusterwatch-collector.service"):
        text = (UNITS / name).read_text()
        assert f"ExecStart={INSTALLED} " in text and "EnvironmentFile=/etc/clusterwatch/clusterwatch.env" in text
        path = tmp_path / name
        path.write_text(text.replace(INSTALLED, script).replace("/etc/clusterwatch/clusterwatch.env", str(env)))
        units.append(path)
    assert _verify(units) == ""
    # the check can fail: a unit with a key systemd ignores and a value it cannot read
    bad = tmp_path / "bad.service"
    bad.write_text("[Service]\nExecStart=/bin/true\nProtectSystem=maybe\nCapabiltyBoundingSet=\n")
    said = _verify([bad])
    assert "bad.service:3: Failed to parse protect system value" in said and "CapabiltyBoundingSet" in said


def _envvars(command: str) -> set[str]:
    params = cli_group.get_command(click.Context(cli_group), command).params
    return {p.envvar for p in params if isinstance(p, click.Option) and isinstance(p.envvar, str)}


def test_every_variable_of_the_env_file_is_read_by_a_command() -> None:
    read = _envvars("collector") | _envvars("agent")
    unknown = sorted(set(_env_file()) - read)
    assert not unknown, f"clusterwatch.env sets variables no command reads: {unknown}"


def test_the_units_commands_run_from_the_env_file(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTERWATCH_")}
    env.update(_env_file())
    marker = env["CW_TEST_MARKER"] = uuid.uuid4().hex  # inherited by every process the two start
    # What an operator edits for their site: here loopback, a temporary store and spool, no GPU. The file
    # turns the collector's Slurm registry on; no slurmctld answers here, which the collector lives with.
    env.update(CLUSTERWATCH_LISTEN="127.0.0.1:0", CLUSTERWATCH_METRICS_LISTEN="127.0.0.1:0",
               CLUSTERWATCH_DB=str(tmp_path / "cw.db"), CLUSTERWATCH_SPOOL=str(tmp_path / "spool"),
               CLUSTERWATCH_TRAIN_SOCKET=str(tmp_path / "train.sock"), CLUSTERWATCH_GPU_SOURCE="none",
               CLUSTERWATCH_INTERVAL="1", SLURM_CONF=str(tmp_path / "absent.conf"))
    logs = {name: open(tmp_path / f"{name}.log", "wb") for name in ("collector", "agent")}
    procs = {}
    ports_file = tmp_path / "ports.json"
    try:
        # --ports-file only to learn the ports bound to :0; everything else comes from the environment.
        procs["collector"] = subprocess.Popen([*CLI, "collector", "--ports-file", str(ports_file)], env=env,
                                              stdout=logs["collector"], stderr=subprocess.STDOUT)
        wait_for(lambda: ports_file.exists() or procs["collector"].poll() is not None, timeout=60,
                 what="the collector's ports")
        assert procs["collector"].poll() is None, (tmp_path / "collector.log").read_text()
        ports = json.loads(ports_file.read_text())
        env["CLUSTERWATCH_COLLECTOR"] = f"127.0.0.1:{ports['grpc']}"
        metrics_port = ports["metrics"]
        procs["agent"] = subprocess.Popen([*CLI, "agent", "--pid", str(os.getpid())], env=env,
                                          stdout=logs["agent"], stderr=subprocess.STDOUT)

        def agent_heard() -> bool:
            for p in procs.values():
                assert p.poll() is None, (tmp_path / "collector.log").read_text() + (tmp_path / "agent.log").read_text()
            try:
                import urllib.request

                with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                return False
            return (metric_value(text, "clusterwatch_ingest_samples_total") or 0) > 0

        wait_for(agent_heard, timeout=60, what="the agent's samples at the collector, both configured by the file")
    finally:
        for name in ("agent", "collector"):  # the agent first: its last batches go to a live collector
            if name in procs:
                procs[name].terminate()
                procs[name].wait(timeout=30)
        for f in logs.values():
            f.close()
    assert procs["agent"].returncode == 0
    assert "samples_sent=" in (tmp_path / "agent.log").read_text()
    # Nothing they started outlives them: the registry's scontrol calls (which hang on the missing slurm.conf
    # until their timeout) are killed when the collector stops.
    assert left_behind("CW_TEST_MARKER", marker) == []

