"""Job mapping against real services: scontrol on the test cluster, listpids over a real sshd."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from clusterwatch.collector.jobmap.base import JobMapper, SlurmUnavailable
from clusterwatch.collector.jobmap.fake import FakeJobMapper
from clusterwatch.collector.jobmap.scontrol import ScontrolMapper
from clusterwatch.collector.jobmap.ssh import SshHostKeyRejected, SshJobMapper, SshListpids, SshUnreachable

from clusterwatch.slurm.listpids import PidEntry, parse_listpids
from clusterwatch.slurm.scontrol import JobRecord
from tests.services.procs import free_port, read_pid, stop_pid
from tests.services.slurm import (  # noqa: F401  (fixtures)
    SlurmCluster,
    running_slurm_cluster,
    slurm_cluster,
    slurm_hooks,
    two_node_gpu_job,
)
from tests.services.sshd import SshServer, slurm_sshd, sshd_server  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def job(slurm_cluster: SlurmCluster) -> Iterator[int]:  # noqa: F811
    with two_node_gpu_job(slurm_cluster, name="cw-ssh-job") as job_id:
        yield job_id


def _ssh(server: SshServer, known_hosts=None, **kwargs) -> SshListpids:
    return SshListpids(
        known_hosts=known_hosts or server.known_hosts,
        client_keys=[server.client_key],
        username=server.username,
        # Both simulated nodes live behind the one loopback sshd.
        address=lambda node: (server.host, server.port),
        **kwargs,
    )


@pytest.mark.slurm
@pytest.mark.ssh
def test_listpids_over_ssh_matches_local_scontrol(
    slurm_cluster: SlurmCluster,  # noqa: F811
    slurm_sshd: SshServer,  # noqa: F811
    job: int,
) -> None:
    async def main() -> dict[str, list[PidEntry]]:
        ssh = _ssh(slurm_sshd, max_concurrency=1)
        mapper = SshJobMapper(ScontrolMapper(env=slurm_cluster.env), ssh)
        try:
            assert isinstance(mapper, JobMapper)
            # Several calls at once over one reused connection, one at a time through the semaphore.
            results = await asyncio.gather(*(mapper.listpids(job, n) for n in slurm_cluster.nodes * 2))
            assert len(ssh._conns) == 1
            return dict(zip(slurm_cluster.nodes * 2, results, strict=True))
        finally:
            await mapper.close()

    over_ssh = asyncio.run(main())
    for node in slurm_cluster.nodes:
        local = parse_listpids(slurm_cluster.run(["scontrol", "listpids", str(job), node]).stdout)
        assert sorted(over_ssh[node], key=lambda e: e.pid) == sorted(local, key=lambda e: e.pid)
        assert any(e.local_id == 0 for e in local)
    assert {e.global_id for n in slurm_cluster.nodes for e in over_ssh[n] if e.global_id is not None} == {
        0,
        1,
    }


@pytest.mark.slurm
@pytest.mark.ssh
def test_listpids_over_ssh_for_a_job_not_on_the_node(slurm_sshd: SshServer) -> None:  # noqa: F811
    async def main() -> list[PidEntry]:
        ssh = _ssh(slurm_sshd)
        try:
            return await ssh.listpids(999999, "n2")
        finally:
            await ssh.close()

    assert asyncio.run(main()) == []


@pytest.mark.ssh
def test_wrong_host_key_is_refused_with_a_clear_line(sshd_server: SshServer) -> None:  # noqa: F811
    async def main() -> None:
        ssh = _ssh(sshd_server, known_hosts=sshd_server.wrong_known_hosts)
        try:
            await ssh.listpids(1, "n1")
        finally:
            await ssh.close()

    with pytest.raises(SshHostKeyRejected) as err:
        asyncio.run(main())
    message = str(err.value)
    assert "\n" not in message
    assert f"127.0.0.1:{sshd_server.port}" in message and str(sshd_server.wrong_known_hosts) in message


@pytest.mark.ssh
def test_unknown_host_key_is_refused(sshd_server: SshServer, tmp_path) -> None:  # noqa: F811
    empty = tmp_path / "known_hosts"
    empty.write_text("")

    async def main() -> None:
        ssh = _ssh(sshd_server, known_hosts=empty)
        try:
            await ssh.listpids(1, "n1")
        finally:
            await ssh.close()

    with pytest.raises(SshHostKeyRejected, match=str(empty)):
        asyncio.run(main())


def test_unreachable_port_fails_quickly_with_a_clear_error(tmp_path) -> None:
    # A listening socket that never answers: the SSH handshake hangs until our connect timeout.
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        port = silent.getsockname()[1]
        known = tmp_path / "known_hosts"
        known.write_text("")

        async def main() -> None:
            ssh = SshListpids(known, [], address={"n9": ("127.0.0.1", port)}, connect_timeout_s=0.5)
            await ssh.listpids(1, "n9")

        started = time.monotonic()
        with pytest.raises(SshUnreachable, match=r"no connection within 0.5 s") as err:
            asyncio.run(main())
        assert time.monotonic() - started < 3
        assert "node n9" in str(err.value)


def test_closed_port_is_a_clear_error(tmp_path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")

    async def main() -> None:
        ssh = SshListpids(known, [], address={"n1": ("127.0.0.1", free_port())}, connect_timeout_s=1)
        await ssh.listpids(1, "n1")

    with pytest.raises(SshUnreachable, match="node n1"):
        asyncio.run(main())


# -------------------------------------------------------------------------- scontrol on the cluster


@pytest.mark.slurm
def test_scontrol_mapper_against_the_cluster(slurm_cluster: SlurmCluster, job: int) -> None:  # noqa: F811
    async def main() -> tuple[JobRecord | None, list[JobRecord], JobRecord | None, list[PidEntry]]:
        mapper = ScontrolMapper(env=slurm_cluster.env)
        shown = await mapper.show_job(job)
        running = await mapper.list_jobs()
        missing = await mapper.show_job(987654)
        pids = await mapper.listpids(job, "n2")
        assert mapper.reachability.reachable is True
        return shown, running, missing, pids

    shown, running, missing, pids = asyncio.run(main())
    assert shown is not None and shown.nodes == ("n1", "n2") and shown.state == "RUNNING"
    assert set(shown.gpus_by_node) == {"n1", "n2"}
    assert job in {j.job_id for j in running}
    assert missing is None
    assert [(p.local_id, p.global_id) for p in pids if p.local_id is not None] == [(0, 1)]


@pytest.mark.serial  # times two 1 s attempts and a backoff (under 4 s)
@pytest.mark.slurm
def test_scontrol_mapper_with_slurmctld_stopped(tmp_path) -> None:
    with running_slurm_cluster(tmp_path / "c") as cluster:
        now = [1000.0]
        mapper = ScontrolMapper(
            env=cluster.env, timeout_s=1.0, retries=1, backoff_s=0.1, clock=lambda: now[0]
        )
        assert asyncio.run(mapper.list_jobs()) == []
        assert mapper.reachability.reachable is True and mapper.reachability.since == 1000.0

        stop_pid(read_pid(cluster.root / "run" / "slurmctld.pid"))  # type: ignore[arg-type]
        now[0] = 2000.0
        started = time.monotonic()
        with pytest.raises(SlurmUnavailable) as err:
            asyncio.run(mapper.show_job(1))
        elapsed = time.monotonic() - started
        # Two attempts of at most 1 s each and one short backoff: never the ~9 s scontrol takes alone.
        assert elapsed < 4, elapsed
        assert str(err.value).startswith("slurmctld did not answer within 1 s; is it running?")
        assert "\n" not in str(err.value)
        reach = mapper.reachability
        assert reach.reachable is False and reach.since == 2000.0 and reach.last_error == str(err.value)
        assert reach.describe().startswith("slurm unreachable since 2000")


def test_fake_mapper_answers_and_fails_like_the_real_one() -> None:
    running = JobRecord(1, "a", "u", 1, None, "p", "RUNNING", None, None, None, None, ("n1",), 1, None)
    ended = JobRecord(2, "b", "u", 1, None, "p", "COMPLETED", None, None, None, None, ("n1",), 1, None)
    fake = FakeJobMapper([running, ended], {(1, "n1"): [PidEntry(10, 1, "0", 0, 0)]})
    assert isinstance(fake, JobMapper)

    async def main() -> None:
        assert await fake.list_jobs() == [running]
        assert await fake.show_job(2) == ended and await fake.show_job(3) is None
        assert await fake.listpids(1, "n1") == [PidEntry(10, 1, "0", 0, 0)]
        assert await fake.listpids(1, "n2") == []
        fake.unavailable = "slurmctld did not answer within 5 s; is it running?"
        with pytest.raises(SlurmUnavailable, match="within 5 s"):
            await fake.show_job(1)

    asyncio.run(main())
    assert fake.calls[0] == ("list_jobs", ())
