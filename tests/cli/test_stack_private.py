"""`clusterwatch run`'s embedded collector is private to its user: another uid cannot reach it.

Its queries are not authenticated (--query-auth none) and its agents send no token, so whoever
reaches its gRPC address could read the job and feed it samples. The probe runs as `nobody`
through runuser (the suite runs as root) with the system's Python, which `nobody` may execute.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

from tests.support.helpers import CLI, clean_environ

pytestmark = pytest.mark.e2e

SYSTEM_PYTHON = "/usr/bin/python3"
# Connects to a gRPC address (unix:PATH or HOST:PORT) and says whether it could.
PROBE = r"""
import socket, sys
address = sys.argv[1]
if address.startswith("unix:"):
    s, target = socket.socket(socket.AF_UNIX), address[len("unix:"):]
else:
    host, _, port = address.rpartition(":")
    s, target = socket.socket(), (host.strip("[]"), int(port))
try:
    s.connect(target)
except OSError as exc:
    print("refused", exc.errno)
else:
    print("connected")
"""


def _probe(address: str, as_nobody: bool) -> str:
    prefix = ["runuser", "-u", "nobody", "--"] if as_nobody else []
    r = subprocess.run([*prefix, SYSTEM_PYTHON, "-c", PROBE, address], capture_output=True, text=True,
                       timeout=30, cwd="/")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.fixture
def needs_nobody():
    """The probe runs as another uid: the suite needs root, runuser and the system's Python.

    A machine without them fails here, in one line: the check it stands for is never skipped.
    """
    missing = [what for what, ok in (("root", os.geteuid() == 0), ("runuser", shutil.which("runuser") is not None),
                                     (SYSTEM_PYTHON, os.access(SYSTEM_PYTHON, os.X_OK))) if not ok]
    assert not missing, f"probing as another uid needs {', '.join(missing)} (scripts/setup.sh runs the suite as root)"


def test_the_probe_as_nobody_reaches_a_loopback_port(needs_nobody):
    # the control: the probe connects where nothing keeps `nobody` out, so a refusal below is the stack's doing
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert _probe(f"127.0.0.1:{server.getsockname()[1]}", as_nobody=True) == "connected"


def test_another_user_cannot_reach_a_runs_collector(needs_nobody, tmp_path):
    keep = tmp_path / "run"
    keep.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(keep, 0o755)  # a --keep folder others may enter: the socket's own folder must keep them out
    proc = subprocess.Popen([*CLI, "run", "--keep", str(keep), "--interval", "0.5", "--gpu-source", "none", "--",
                             sys.executable, "-c", "import time; time.sleep(60)"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=clean_environ())
    try:
        address = None
        for line in proc.stderr:
            found = re.search(r"collector on (\S+)", line)
            if found:
                address = found.group(1)
                break
        assert address, "run never said where its collector is"
        assert _probe(address, as_nobody=False) == "connected"
        assert _probe(address, as_nobody=True).startswith("refused")
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


def test_a_run_opens_no_tcp_port(tmp_path):
    # run shows no /metrics (demo does): nothing of a run listens where another user could connect
    keep = tmp_path / "run"
    r = subprocess.run([*CLI, "run", "--keep", str(keep), "--interval", "0.5", "--gpu-source", "none", "--",
                        sys.executable, "-c", "pass"], capture_output=True, text=True, timeout=90, env=clean_environ())
    assert r.returncode == 0, r.stderr
    ports = json.loads((keep / "ports.json").read_text())
    assert ports["metrics"] == 0 and ports["query"] == 0, ports
    assert "/metrics on port -" in (keep / "collector.log").read_text()
