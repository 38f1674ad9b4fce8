"""--tls-ca is a value handed to the query channel, not a setting left in the process's environment."""
from __future__ import annotations

import os
import subprocess

import pytest
from click.testing import CliRunner
from clusterwatch.cli.main import cli as cli_group

from tests.support.helpers import Collector, cli

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    d = tmp_path_factory.mktemp("ca")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                    "/CN=test", "-keyout", "k.pem", "-out", "c.pem"], cwd=d, check=True, capture_output=True,
                   timeout=60)
    return str(d / "c.pem")


def test_one_commands_tls_ca_does_not_reach_the_next_in_the_same_process(tmp_path, ca, monkeypatch):
    for name in [k for k in os.environ if k.startswith("CLUSTERWATCH_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("CLUSTERWATCH_TLS_CA", ca)  # recorded absent, so restored absent whatever the CLI sets
    monkeypatch.delenv("CLUSTERWATCH_TLS_CA")
    col = Collector(tmp_path)  # plaintext
    try:
        runner = CliRunner()
        r = runner.invoke(cli_group, ["jobs", "--collector", col.address, "--tls-ca", ca])
        assert r.exit_code == 1  # TLS to a plaintext port: refused, as it should be
        r = runner.invoke(cli_group, ["jobs", "--collector", col.address])
        assert r.exit_code == 0, r.output
    finally:
        col.stop()


def test_run_works_with_a_tls_ca_set_for_the_users_own_collector(ca):
    # CLUSTERWATCH_TLS_CA is for the user's cluster collector; run's own collector is plaintext on a socket
    r = cli("run", "--interval", "0.5", "--gpu-source", "none", "--", "python3", "-c", "import time; time.sleep(2)",
            env={"CLUSTERWATCH_TLS_CA": ca}, timeout=90)
    assert r.returncode == 0, r.stderr
    assert "clusterwatch · job local-" in r.stderr
    assert "does not answer" not in r.stderr
