"""A real OpenSSH server on 127.0.0.1 (a free port) with its own host key, client key and known_hosts.

Fixtures::

    from tests.services.sshd import sshd_server, slurm_sshd  # noqa: F401  (registers the fixtures)

``sshd_server`` is a bare server; ``slurm_sshd`` also sets ``SLURM_CONF`` for every session
(``SetEnv``) so ``scontrol`` run over SSH talks to the test cluster. Or use :func:`running_sshd`.
sshd is stopped by the PID in its pid file.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.waiting import poll_until
from tests.services.procs import free_port, pid_alive, read_pid, require_binary, stop_pid
from tests.services.slurm import SlurmCluster


@dataclass(frozen=True)
class SshServer:
    """A running sshd.

    Attributes:
        host: always 127.0.0.1.
        port: the port it listens on.
        username: the user to log in as (the one running the tests).
        client_key: private key file accepted by the server.
        known_hosts: a known_hosts file holding the server's real host key for ``[host]:port``.
        wrong_known_hosts: a known_hosts file holding a different key for the same host and port.
        root: the folder with config, keys, pid file and log (``sshd.log``).
    """

    host: str
    port: int
    username: str
    client_key: Path
    known_hosts: Path
    wrong_known_hosts: Path
    root: Path


def _keygen(path: Path, ssh_keygen: str) -> str:
    subprocess.run([ssh_keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True, timeout=30)
    return path.with_suffix(".pub").read_text().strip()


# OpenSSH's privilege separation directory, fixed when it is built (Debian's: /run/sshd); sshd refuses to
# start, even to check its config, without it. The init script that creates it does not run here.
PRIVSEP_DIR = "/run/sshd"


def _privsep_wrapper() -> list[str]:
    """What to run sshd under so that it has its privilege separation directory without touching the host.

    Where the host has one, nothing. Where it has none, sshd runs in a mount namespace of its own whose
    /run is an empty tmpfs holding just that directory: nothing is created on the host, and what its
    sessions run here (scontrol listpids against the test cluster, whose sockets and spool live in the
    cluster's temporary folder) needs nothing of the host's /run.
    """
    if os.path.isdir(PRIVSEP_DIR):
        return []
    unshare = require_binary("unshare", "util-linux")
    return [unshare, "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
            f'mount -n -t tmpfs -o mode=755 cw-sshd-run /run && mkdir -m 755 {PRIVSEP_DIR} && exec "$@"', "sh"]


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
        return sock.recv(4).startswith(b"SSH-")
    return False


@contextlib.contextmanager
def running_sshd(root: Path | None = None, set_env: Mapping[str, str] | None = None) -> Iterator[SshServer]:
    """Start sshd on 127.0.0.1 with key-only login for the current user; stop it by PID on exit.

    Args:
        root: an empty folder for its files; a new temporary folder when None.
        set_env: variables every SSH session gets (sshd ``SetEnv``), e.g. SLURM_CONF.

    Yields:
        The running server.
    """
    import getpass

    sshd = require_binary("sshd", "openssh-server")
    ssh_keygen = require_binary("ssh-keygen", "openssh-client")
    with contextlib.ExitStack() as stack:
        if root is None:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cw-sshd-")))
        root = Path(root).resolve()
        wrapper = _privsep_wrapper()
        host_pub = _keygen(root / "host_ed25519", ssh_keygen)
        client_pub = _keygen(root / "client_ed25519", ssh_keygen)
        other_pub = _keygen(root / "other_host_ed25519", ssh_keygen)
        (root / "authorized_keys").write_text(client_pub + "\n")
        port = free_port()
        key_type_and_body = " ".join(host_pub.split()[:2])
        (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {key_type_and_body}\n")
        (root / "wrong_known_hosts").write_text(f"[127.0.0.1]:{port} {' '.join(other_pub.split()[:2])}\n")
        env_line = ""
        if set_env:
            env_line = "SetEnv " + " ".join(f"{k}={v}" for k, v in set_env.items()) + "\n"
        config = root / "sshd_config"
        config.write_text(
            f"Port {port}\n"
            "ListenAddress 127.0.0.1\n"
            f"HostKey {root}/host_ed25519\n"
            f"PidFile {root}/sshd.pid\n"
            f"AuthorizedKeysFile {root}/authorized_keys\n"
            "PermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            # The temporary folder is not owned the way StrictModes wants home folders to be.
            "StrictModes no\n" + env_line
        )
        check = subprocess.run([*wrapper, sshd, "-t", "-f", str(config)], capture_output=True, text=True, timeout=30)
        if check.returncode != 0:
            pytest.fail(f"sshd rejected its config: {check.stderr.strip()}", pytrace=False)
        pid_file = root / "sshd.pid"

        def stop() -> None:
            pid = read_pid(pid_file)
            if pid is not None:
                stop_pid(pid)

        stack.callback(stop)
        started = subprocess.run(
            [*wrapper, sshd, "-f", str(config), "-E", str(root / "sshd.log")],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if started.returncode != 0:
            pytest.fail(f"sshd did not start: {started.stderr.strip()}", pytrace=False)
        up = poll_until(lambda: (p := read_pid(pid_file)) is not None and pid_alive(p) and _accepts(port), 10.0)
        if not up:
            log = (root / "sshd.log").read_text(errors="replace") if (root / "sshd.log").exists() else ""
            pytest.fail(f"sshd not accepting on 127.0.0.1:{port} within 10 s\n{log}", pytrace=False)
        yield SshServer(
            host="127.0.0.1",
            port=port,
            username=getpass.getuser(),
            client_key=root / "client_ed25519",
            known_hosts=root / "known_hosts",
            wrong_known_hosts=root / "wrong_known_hosts",
            root=root,
        )


@pytest.fixture(scope="session")
def sshd_server() -> Iterator[SshServer]:
    """A bare sshd on 127.0.0.1 for the whole session."""
    with running_sshd() as server:
        yield server


@pytest.fixture(scope="session")
def slurm_sshd(slurm_cluster: SlurmCluster) -> Iterator[SshServer]:
    """An sshd whose sessions have SLURM_CONF set to the test cluster's, so scontrol works over SSH."""
    with running_sshd(set_env={"SLURM_CONF": str(slurm_cluster.conf)}) as server:
        yield server
