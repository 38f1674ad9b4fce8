"""deploy/systemd/clusterwatch-collector@.service: several collectors on one host, each with its own ports
and store from its instance env file, checked as tests/project/test_systemd_units.py checks the other units."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.project.test_systemd_units import INSTALLED, UNITS, _env_file, _envvars, _verify
from tests.services.procs import free_port
from tests.support.helpers import CLI, cli, wait_for

TEMPLATE = UNITS / "clusterwatch-collector@.service"
INSTANCE_ENV = UNITS / "collector-instance.env"


def _instance_env(n: int, grpc: int, metrics: int, web: int = 9800) -> dict[str, str]:
    text = (INSTANCE_ENV.read_text().replace("@N@", str(n)).replace("@HOST@", "127.0.0.1").replace("@GRPC@", str(grpc))
            .replace("@METRICS@", str(metrics)).replace("@WEB@", str(web)))
    assert "@" not in "".join(line for line in text.splitlines() if not line.startswith("#")), text
    pairs = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            pairs[key] = value
    return pairs


def test_systemd_analyze_verify_an_instance_of_the_template(tmp_path: Path) -> None:
    script = shutil.which("clusterwatch", path=os.path.dirname(sys.executable))
    assert script
    text = TEMPLATE.read_text()
    assert text.count(f"ExecStart={INSTALLED} collector") == 1
    assert "EnvironmentFile=/etc/clusterwatch/collector-%i.env" in text
    assert "StateDirectory=clusterwatch/collector-%i" in text
    # the template differs from the single unit only in what an instance has of its own
    single = (UNITS / "clusterwatch-collector.service").read_text()
    keys = {line for line in single.splitlines() if line and not line.startswith("#") and "=" in line}
    own = {line for line in text.splitlines() if line and not line.startswith("#") and "=" in line}
    assert keys - own == {"Description=clusterwatch collector", "StateDirectory=clusterwatch"}
    (tmp_path / TEMPLATE.name).write_text(text.replace(INSTALLED, script))
    assert _verify([tmp_path / "clusterwatch-collector@3.service"]) == ""
    # it can fail: the same instance of a template with a value systemd cannot read
    (tmp_path / TEMPLATE.name).write_text(text.replace(INSTALLED, script) + "ProtectSystem=maybe\n")
    said = _verify([tmp_path / "clusterwatch-collector@3.service"])
    assert "Unknown key 'ProtectSystem' in section [Install]" in said


def test_instance_env_sets_only_collector_variables_ports_by_rank() -> None:
    env = _instance_env(2, 50052, 9751)
    assert set(env) <= _envvars("collector")
    assert env["CLUSTERWATCH_LISTEN"].endswith(":50052") and env["CLUSTERWATCH_METRICS_LISTEN"].endswith(":9751")
    assert env["CLUSTERWATCH_DB"] == "/var/lib/clusterwatch/collector-2/clusterwatch.db"
    assert env["CLUSTERWATCH_SHARD"] == "127.0.0.1:50052"  # its own entry in the collectors list
    from clusterwatch.prometheus_targets import metrics_address

    assert metrics_address("host:50052") == "host:9751"  # the rule Prometheus's target list follows


def test_two_instances_run_side_by_side_from_their_env_files(tmp_path: Path) -> None:
    procs = []
    try:
        ports = []
        grpc_ports = [free_port(), free_port()]
        everyone = ",".join(f"127.0.0.1:{p}" for p in grpc_ports)  # the deployment's list: both instances
        for n in (1, 2):
            env = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTERWATCH_")}
            env.update(_env_file())  # the shared file first, the instance's wins (systemd's order)
            grpc, metrics, web = grpc_ports[n - 1], free_port(), free_port()
            inst = _instance_env(n, grpc, metrics, web)
            inst["CLUSTERWATCH_LISTEN"] = inst["CLUSTERWATCH_LISTEN"].replace("0.0.0.0", "127.0.0.1")
            inst["CLUSTERWATCH_METRICS_LISTEN"] = inst["CLUSTERWATCH_METRICS_LISTEN"].replace("0.0.0.0", "127.0.0.1")
            inst["CLUSTERWATCH_DB"] = str(tmp_path / inst["CLUSTERWATCH_DB"].lstrip("/"))
            Path(inst["CLUSTERWATCH_DB"]).parent.mkdir(parents=True)  # systemd's StateDirectory
            # no Slurm, and queries open (munged is not a part of this test: tests/support/helpers.py Collector does so)
            env.update(inst, CLUSTERWATCH_SLURM="0", CLUSTERWATCH_QUERY_AUTH="none", CLUSTERWATCH_COLLECTORS=everyone)
            ports.append((grpc, metrics, web, Path(inst["CLUSTERWATCH_DB"])))
            log = open(tmp_path / f"c{n}.log", "wb")
            procs.append(subprocess.Popen([*CLI, "collector"], env=env, stdout=log, stderr=subprocess.STDOUT))
            log.close()

        def answers(port: int, path: str = "/metrics") -> bool:
            assert all(p.poll() is None for p in procs), [(tmp_path / f"c{n}.log").read_text() for n in (1, 2)]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                    return r.status == 200
            except OSError:
                return False

        for grpc, metrics, web, db in ports:
            wait_for(lambda m=metrics: answers(m), timeout=60, what=f"/metrics on {metrics}")
            wait_for(lambda w=web: answers(w, "/"), timeout=60, what=f"the web pages on {web}")  # each its own
            wait_for(db.exists, timeout=30, what=f"the store {db}")
            assert cli("jobs", "--collector", f"127.0.0.1:{grpc}").returncode == 0  # its gRPC port too
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)
    assert [p.returncode for p in procs] == [0, 0]
    assert not any("serving no web pages" in (tmp_path / f"c{n}.log").read_text() for n in (1, 2))
