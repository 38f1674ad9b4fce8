"""A real two-node Slurm cluster on loopback, in a temporary folder, for integration tests.

The set-up follows what was seen working on these machines with Debian's Slurm 22.05: one munged of our
own (own key, own socket, so a system munged or a second cluster never interferes), one slurmctld, and
two slurmd on one host (``slurmd -N n1``, ``slurmd -N n2``), each with its own port, all on 127.0.0.1.
Fake GPUs are character devices made with mknod (slurmd drops GPUs given by ``Count=`` alone).

Use it as a pytest fixture::

    from tests.services.slurm import slurm_cluster  # noqa: F401  (registers the fixture)

    @pytest.mark.slurm
    def test_x(slurm_cluster):
        slurm_cluster.run(["srun", "-N2", "true"])

or as a context manager, with your own Prolog and Epilog::

    with running_slurm_cluster(tmp, prolog=Path("my_prolog.sh")) as cluster:
        ...

Every daemon is stopped by the PID in its pid file when the fixture or the ``with`` block ends, and any
job still running is cancelled first, so nothing is left behind.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench.waiting import poll_until
from clusterwatch.slurm.listpids import parse_listpids
from tests.services.procs import free_port, pid_alive, read_pid, require_binary, stop_pid

#: Simulated node names, in the order of the slurm.conf lines.
NODES = ("n1", "n2")
#: Fake GPUs per node; node i gets /dev/nvidia{2i}, {2i+1} under the cluster's folder.
GPUS_PER_NODE = 2
#: Bound on waiting for both nodes to become idle (they usually are within a second).
START_TIMEOUT_S = 30.0
#: Bound on one Slurm client call: with slurmctld down each call takes about 9 s to fail.
CLIENT_TIMEOUT_S = 15.0

_DEFAULT_HOOK = "#!/bin/sh\n# Slurm drains a node whose Prolog/Epilog fails: always succeed.\nexit 0\n"


@dataclass(frozen=True)
class SlurmHooks:
    """Prolog and Epilog scripts for the cluster; None means a script that only ``exit 0``."""

    prolog: Path | None = None
    epilog: Path | None = None


@dataclass
class SlurmCluster:
    """A running test cluster.

    Attributes:
        root: the temporary folder holding config, state, spool, logs and fake devices.
        conf: path of slurm.conf (what SLURM_CONF must point to).
        env: environment for srun/sbatch/scontrol: this process's, minus inherited SLURM_* variables,
            plus SLURM_CONF.
        nodes: the simulated node names.
        ctld_port: slurmctld's TCP port on 127.0.0.1.
        node_ports: slurmd TCP port by node name.
        prolog: the Prolog script slurmd runs.
        epilog: the Epilog script slurmd runs.
        gpu_devices: fake GPU device paths by node name.
    """

    root: Path
    conf: Path
    env: dict[str, str]
    nodes: tuple[str, ...]
    ctld_port: int
    node_ports: dict[str, int]
    prolog: Path
    epilog: Path
    gpu_devices: dict[str, list[Path]] = field(default_factory=dict)

    @property
    def log_dir(self) -> Path:
        """Folder with slurmctld.log, slurmd-<node>.log and munged.log."""
        return self.root / "log"

    def run(
        self,
        args: Sequence[str],
        timeout: float = CLIENT_TIMEOUT_S,
        check: bool = True,
        **kwargs,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command (``srun``, ``scontrol``...) against this cluster with a timeout.

        Args:
            args: the command and its arguments.
            timeout: seconds before the command is killed (raises subprocess.TimeoutExpired).
            check: raise subprocess.CalledProcessError on a non-zero exit, with stderr in the message.
            **kwargs: passed to subprocess.run (for example ``input=``).

        Returns:
            The completed process, stdout and stderr as text.
        """
        # Run in the cluster's folder so sbatch's slurm-<id>.out files never land in the caller's tree.
        kwargs.setdefault("cwd", self.root)
        proc = subprocess.run(
            list(args), env=self.env, capture_output=True, text=True, timeout=timeout, **kwargs
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)} exited {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}"
            )
        return proc

    def popen(self, args: Sequence[str], **kwargs) -> subprocess.Popen[str]:
        """Start a command against this cluster in the background (the caller waits for or kills it)."""
        kwargs.setdefault("cwd", self.root)
        return subprocess.Popen(
            list(args), env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs
        )

    def node_states(self) -> dict[str, str]:
        """Return each node's state as sinfo prints it (``idle``, ``alloc``, ``mix``, ``down*``...)."""
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False, timeout=CLIENT_TIMEOUT_S)
        states: dict[str, str] = {}
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    def wait_job_state(self, job_id: int, states: Sequence[str], timeout: float = 30.0) -> str:
        """Wait until ``job_id`` is in one of ``states`` (e.g. ``RUNNING``); return the state seen.

        Raises:
            AssertionError: the job did not reach any of the states within ``timeout`` seconds.
        """
        seen = ""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], check=False)
            seen = out.stdout.strip()
            if seen in states:
                return seen
            if not seen:
                out = self.run(["scontrol", "show", "job", str(job_id)], check=False)
                for token in out.stdout.split():
                    if token.startswith("JobState="):
                        seen = token.split("=", 1)[1]
                if seen in states:
                    return seen
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} did not reach {list(states)} within {timeout} s (last: {seen!r})")

    def logs(self) -> str:
        """Return the tail of every daemon log, for assertion messages."""
        chunks = []
        for path in sorted(self.log_dir.glob("*.log")):
            lines = path.read_text(errors="replace").splitlines()[-30:]
            chunks.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(chunks)


def _write_hook(path: Path, given: Path | None) -> Path:
    if given is not None:
        return Path(given).resolve()
    path.write_text(_DEFAULT_HOOK)
    path.chmod(0o755)
    return path


def _slurm_conf(root: Path, ctld_port: int, node_ports: dict[str, int], prolog: Path, epilog: Path,
                first_job_id: int) -> str:
    node_lines = "\n".join(
        f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} "
        f"CPUs=2 RealMemory=8000 Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN"
        for node, port in node_ports.items()
    )
    nodes = ",".join(node_ports)
    return f"""\
ClusterName=cwtest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# Our own munged socket: a system munged, or another test cluster, never answers for us.
AuthInfo=socket={root}/munge/munge.socket
SlurmctldPort={ctld_port}
# Several test clusters run at once on one host, with the same node names, and an agent takes a host's
# processes by their SLURM_JOB_ID and SLURMD_NODENAME: each cluster numbers its jobs from a place of its own.
FirstJobId={first_job_id}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
# Short waits between SIGTERM and SIGKILL so scancel at teardown is quick.
KillWait=2
InactiveLimit=0
Prolog={prolog}
Epilog={epilog}
PrologFlags=Alloc
GresTypes=gpu
{node_lines}
PartitionName=debug Nodes={nodes} Default=YES MaxTime=INFINITE State=UP
"""


def _gres_conf(devices: dict[str, list[Path]]) -> str:
    lines = ["AutoDetect=off"]
    for node, paths in devices.items():
        for path in paths:
            lines.append(f"NodeName={node} Name=gpu File={path}")
    return "\n".join(lines) + "\n"


def _clean_env(conf: Path) -> dict[str, str]:
    # A test run inside a Slurm job (or a login shell with SLURM_* set) must not leak into our cluster.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["SLURM_CONF"] = str(conf)
    env["PATH"] = os.pathsep.join([env.get("PATH", ""), "/usr/sbin", "/sbin"])
    return env


def _processes_of(conf: Path) -> list[int]:
    """PIDs whose environment names our slurm.conf: slurmstepd and job tasks that outlived scancel.

    They inherit SLURM_CONF from the slurmd we started, so this finds only processes this cluster made.
    """
    marker = f"SLURM_CONF={conf}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


@contextlib.contextmanager
def running_slurm_cluster(
    root: Path | None = None,
    prolog: Path | None = None,
    epilog: Path | None = None,
    start_timeout: float = START_TIMEOUT_S,
) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and two slurmd on loopback; stop them all by PID on exit.

    Args:
        root: an empty folder for the cluster's files; a new temporary folder when None.
        prolog: the Prolog script (must exist and be executable; it should always exit 0, quickly).
            None: a script that does ``exit 0``.
        epilog: the Epilog script, same rules.
        start_timeout: seconds to wait for both nodes to be idle.

    Yields:
        The running cluster.

    Raises:
        pytest.fail.Exception: a binary is missing (naming its Debian package) or the cluster did not
            come up in time (with the daemons' logs).
    """
    binaries = {
        "munged": require_binary("munged", "munge"),
        "slurmctld": require_binary("slurmctld", "slurmctld"),
        "slurmd": require_binary("slurmd", "slurmd"),
        "scontrol": require_binary("scontrol", "slurm-client"),
        "srun": require_binary("srun", "slurm-client"),
        "mknod": require_binary("mknod", "coreutils"),
    }
    with contextlib.ExitStack() as stack:
        if root is None:
            # Short path: munge's unix socket path must stay under 108 bytes.
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cw-slurm-")))
        root = Path(root).resolve()
        for sub in ("state", "run", "log", "dev", "munge", *(f"spool/{n}" for n in NODES)):
            (root / sub).mkdir(parents=True, exist_ok=True)
        # munged refuses a key or socket folder others can write to.
        (root / "munge").chmod(0o700)

        devices: dict[str, list[Path]] = {}
        for i, node in enumerate(NODES):
            devices[node] = []
            for j in range(GPUS_PER_NODE):
                minor = i * GPUS_PER_NODE + j
                dev = root / "dev" / f"nvidia{minor}"
                subprocess.run([binaries["mknod"], str(dev), "c", "195", str(minor)], check=True)
                devices[node].append(dev)

        prolog_path = _write_hook(root / "prolog.sh", prolog)
        epilog_path = _write_hook(root / "epilog.sh", epilog)
        ctld_port = free_port()
        node_ports = {node: free_port() for node in NODES}
        conf = root / "slurm.conf"
        first_job_id = random.SystemRandom().randrange(1000, 60_000_000)  # under Slurm's MaxJobId, 67,043,328
        conf.write_text(_slurm_conf(root, ctld_port, node_ports, prolog_path, epilog_path, first_job_id))
        (root / "gres.conf").write_text(_gres_conf(devices))
        env = _clean_env(conf)
        cluster = SlurmCluster(
            root=root,
            conf=conf,
            env=env,
            nodes=NODES,
            ctld_port=ctld_port,
            node_ports=node_ports,
            prolog=prolog_path,
            epilog=epilog_path,
            gpu_devices=devices,
        )

        pid_files = [root / "munge" / "munged.pid", root / "run" / "slurmctld.pid"]
        pid_files += [root / "run" / f"slurmd-{n}.pid" for n in NODES]
        # Registered before anything starts, so a failed start still stops what did start.
        stack.callback(_stop_cluster, cluster, pid_files)

        key = root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        _start(
            [
                binaries["munged"],
                f"--socket={root}/munge/munge.socket",
                f"--key-file={key}",
                f"--pid-file={root}/munge/munged.pid",
                f"--log-file={root}/log/munged.log",
                f"--seed-file={root}/munge/munged.seed",
                # munged as root complains about key ownership checks meant for a munge user.
                "--force",
            ],
            env,
            root / "munge" / "munged.pid",
            cluster,
        )
        _start([binaries["slurmctld"], "-i"], env, root / "run" / "slurmctld.pid", cluster)
        for node in NODES:
            _start([binaries["slurmd"], "-N", node], env, root / "run" / f"slurmd-{node}.pid", cluster)

        def all_idle() -> bool:
            states = cluster.node_states()
            return all(states.get(n) == "idle" for n in NODES)

        if not poll_until(all_idle, start_timeout, interval=0.2):
            pytest.fail(
                f"Slurm nodes not idle within {start_timeout} s: {cluster.node_states()}\n{cluster.logs()}",
                pytrace=False,
            )
        yield cluster


def _start(args: list[str], env: dict[str, str], pid_file: Path, cluster: SlurmCluster) -> int:
    """Run a self-daemonizing daemon and wait for its pid file; return the daemon's PID."""
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S)
    if proc.returncode != 0:
        pytest.fail(
            f"{' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}\n{cluster.logs()}",
            pytrace=False,
        )
    if not poll_until(lambda: (p := read_pid(pid_file)) is not None and pid_alive(p), 10.0):
        pytest.fail(f"{args[0]} wrote no live pid to {pid_file}\n{cluster.logs()}", pytrace=False)
    return read_pid(pid_file)  # type: ignore[return-value]


def _stop_cluster(cluster: SlurmCluster, pid_files: list[Path]) -> None:
    """Cancel jobs, then stop slurmd, slurmctld, leftovers and munged, each by its own PID."""
    ctld = read_pid(pid_files[1])
    if ctld is not None and pid_alive(ctld):
        with contextlib.suppress(subprocess.TimeoutExpired):
            jobs = cluster.run(["squeue", "-h", "-o", "%i"], check=False, timeout=5).stdout.split()
            if jobs:
                cluster.run(["scancel", *jobs], check=False, timeout=5)

                def no_jobs() -> bool:
                    out = cluster.run(["squeue", "-h", "-t", "all", "-o", "%T"], check=False, timeout=5)
                    return not any(s in {"RUNNING", "PENDING", "COMPLETING"} for s in out.stdout.split())

                poll_until(no_jobs, 10.0, interval=0.2)
    # slurmd first (they talk to slurmctld on the way out), munged last (everyone authenticates with it).
    for pid_file in [*pid_files[2:], pid_files[1]]:
        pid = read_pid(pid_file)
        if pid is not None:
            stop_pid(pid)
    for pid in _processes_of(cluster.conf):
        stop_pid(pid, grace=1.0)
    pid = read_pid(pid_files[0])
    if pid is not None:
        stop_pid(pid)


@pytest.fixture(scope="session")
def slurm_hooks() -> SlurmHooks:
    """Prolog/Epilog for the session cluster; override this fixture to install your own scripts."""
    return SlurmHooks()


# One cluster per distinct hooks, shared by every test module that imports the fixture: importing a
# fixture into two modules makes two fixture definitions, and without this each would start a cluster.
_shared: dict[SlurmHooks, tuple[SlurmCluster, contextlib.ExitStack, list[int]]] = {}


@pytest.fixture(scope="session")
def slurm_cluster(slurm_hooks: SlurmHooks) -> Iterator[SlurmCluster]:
    """The running two-node test cluster (session scope), with the Prolog/Epilog from ``slurm_hooks``."""
    if slurm_hooks not in _shared:
        stack = contextlib.ExitStack()
        cluster = stack.enter_context(
            running_slurm_cluster(prolog=slurm_hooks.prolog, epilog=slurm_hooks.epilog)
        )
        _shared[slurm_hooks] = (cluster, stack, [0])
    cluster, stack, refs = _shared[slurm_hooks]
    refs[0] += 1
    try:
        yield cluster
    finally:
        refs[0] -= 1
        if refs[0] == 0:
            del _shared[slurm_hooks]
            stack.close()


#: What :func:`two_node_gpu_job` runs on each node.
WORKLOAD = "import time; time.sleep(120)"


@contextlib.contextmanager
def two_node_gpu_job(
    cluster: SlurmCluster, name: str = "cw-two-node", timeout: float = 30.0
) -> Iterator[int]:
    """Run ``srun -N2 --ntasks-per-node=1 --gres=gpu:1 python3 -c WORKLOAD``; yield its job id.

    Returns once the task runs on every node (``scontrol listpids`` shows it); cancels the job on exit.
    """
    proc = cluster.popen(
        ["srun", "-N2", "--ntasks-per-node=1", "--gres=gpu:1", "-J", name, "python3", "-c", WORKLOAD]
    )
    job_id: int | None = None
    try:
        deadline = time.monotonic() + timeout
        while job_id is None and time.monotonic() < deadline:
            out = cluster.run(["squeue", "-h", "-n", name, "-o", "%i"]).stdout.split()
            job_id = int(out[0]) if out else None
            time.sleep(0.1)
        if job_id is None:
            raise AssertionError(f"srun job {name} never appeared\n{cluster.logs()}")
        cluster.wait_job_state(job_id, ["RUNNING"], timeout=timeout)

        def tasks_up() -> bool:
            for node in cluster.nodes:
                out = cluster.run(["scontrol", "listpids", str(job_id), node], check=False).stdout
                if not any(e.step_id == "0" and e.local_id == 0 for e in parse_listpids(out)):
                    return False
            return True

        if not poll_until(tasks_up, timeout, interval=0.2):
            raise AssertionError(f"job {job_id}: tasks did not start on every node\n{cluster.logs()}")
        yield job_id
    finally:
        if job_id is not None:
            cluster.run(["scancel", str(job_id)], check=False)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
