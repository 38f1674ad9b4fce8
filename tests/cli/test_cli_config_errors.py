"""Errors say what the user gave, where they gave it (issue 26): a bad value from the config file names the file
and its key, one from the environment its variable; --db naming a folder or a path whose folder is missing says
so and creates nothing; a taken port is named."""
from __future__ import annotations

import socket
import subprocess

import pytest

from tests.support.helpers import CLI, clean_environ


def _clusterwatch(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60,
                          env={**clean_environ(), **(env or {})})


def _config(tmp_path, text: str) -> str:
    path = tmp_path / "site.toml"
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


@pytest.mark.parametrize(("text", "args", "said"), [
    ('[agent]\ninterval = "fast"\n', ["agent", "--once"], "[agent] interval: 'fast' is not a valid float range."),
    ('[agent]\ngpu_source = "cuda"\n', ["agent", "--once"],
     "[agent] gpu_source: 'cuda' is not one of 'auto', 'nvml', 'sim', 'none'."),
    ('[cli]\ncollector = "nohost"\n', ["jobs"], "[cli] collector 'nohost' has no port: give HOST:PORT"),
    ('[collector]\nmetrics_listen = "abc"\n', ["collector"], "[collector] metrics_listen: 'abc' has no port"),
])
def test_a_bad_value_in_the_config_file_names_the_file_and_the_key(tmp_path, text, args, said):
    path = _config(tmp_path, text)
    done = _clusterwatch("--config", path, *args)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"clusterwatch: config file {path}: {said}"), line
    assert "--" not in line.split(said)[0]  # no flag the user never typed


def test_a_bad_value_in_the_environment_names_the_variable():
    done = _clusterwatch("agent", "--once", env={"CLUSTERWATCH_INTERVAL": "fast"})
    assert done.returncode == 2
    assert done.stderr == "clusterwatch: CLUSTERWATCH_INTERVAL: 'fast' is not a valid float range.\n"


def _collector(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return _clusterwatch("collector", "--listen", "127.0.0.1:0", "--metrics-listen", "none", "--web-listen", "none",
                         "--query-auth", "none", *args)


def test_db_naming_a_folder_says_so(tmp_path):
    done = _collector(tmp_path, "--db", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr == (f"clusterwatch: --db {tmp_path} is a folder; it names the store's file: give "
                           f"{tmp_path / 'clusterwatch.db'}\n")


def test_a_mistyped_db_path_creates_no_folder(tmp_path):
    db = tmp_path / "mistyped" / "deeper" / "clusterwatch.db"
    done = _collector(tmp_path, "--db", str(db))
    assert done.returncode == 2
    assert done.stderr.startswith(f"clusterwatch: --db {db}: the folder {db.parent} does not exist"), done.stderr
    assert not (tmp_path / "mistyped").exists()


def test_a_taken_metrics_port_is_named(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _clusterwatch("collector", "--listen", "127.0.0.1:0", "--metrics-listen", f"127.0.0.1:{port}",
                             "--web-listen", "none", "--query-auth", "none", "--db", str(tmp_path / "cw.db"))
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert f"cannot listen on 127.0.0.1:{port}" in line and "--metrics-listen" in line, line
