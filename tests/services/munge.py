"""A munged of the test's own (own key, own socket), started and stopped by its pid."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def munged() -> Iterator[Path]:
    """Yields the socket path of a running munged; fails (never skips) without Debian's munge package."""
    binary = shutil.which("munged") or ("/usr/sbin/munged" if os.path.exists("/usr/sbin/munged") else None)
    if binary is None or not shutil.which("munge"):
        pytest.fail("munged/munge not found: install Debian's munge package (scripts/setup.sh does)")
    # a short path: the socket path must stay under 108 bytes
    root = Path(tempfile.mkdtemp(prefix="cw-munge-", dir="/tmp"))
    root.chmod(0o700)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    sock, pidfile = root / "munge.socket", root / "munged.pid"
    subprocess.run([binary, f"--socket={sock}", f"--key-file={key}", f"--pid-file={pidfile}",
                    f"--log-file={root}/munged.log", f"--seed-file={root}/munged.seed", "--force"],
                   check=True, timeout=20)
    deadline = time.monotonic() + 10
    while not (pidfile.exists() and sock.exists()):
        if time.monotonic() > deadline:
            pytest.fail(f"munged did not start: {(root / 'munged.log').read_text(errors='replace')[-500:]}")
        time.sleep(0.05)
    # others (the test's unprivileged user) must reach the socket, as on a real node
    root.chmod(0o755)
    try:
        yield sock
    finally:
        pid = int(pidfile.read_text().strip())
        os.kill(pid, 15)
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.05)
        shutil.rmtree(root, ignore_errors=True)
