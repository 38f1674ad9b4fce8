"""Actions on a job's processes are opt-in and owner-only on the query service (issue 24): a real collector, a
real agent and a real trainer using clusterwatch.train (tests/support/trainers.py), asked over gRPC as
`clusterwatch diagnose` asks.

Without authenticated queries nobody is anybody in particular: AskTraining (stacks, snapshots, checkpoints,
stops) is refused unless the collector was started with --allow-unauthenticated-actions, and the refusal
names that flag. Under munge, seeing every job (--show-all-jobs) is not acting on it: only the job's owner or
an admin acts.
"""
from __future__ import annotations

import subprocess

import grpc
import pytest
from clusterwatch.cli.common import MUNGE_PAYLOAD
from clusterwatch.v1 import query_pb2, query_pb2_grpc

from tests.support.helpers import Collector, cli, unique_job_id, wait_for
from tests.support.trainers import start_trainer

pytestmark = pytest.mark.e2e

FLAG = "--allow-unauthenticated-actions"


def _ask(address: str, job_id: str, kind: str, metadata=None) -> query_pb2.AskTrainingResponse:
    channel = grpc.insecure_channel(address)
    try:
        return query_pb2_grpc.QueryStub(channel).AskTraining(
            query_pb2.AskTrainingRequest(job_id=job_id, kind=kind, timeout_s=10), timeout=20, metadata=metadata)
    finally:
        channel.close()


def _refused(address: str, job_id: str, kind: str, metadata=None) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refused:
        _ask(address, job_id, kind, metadata)
    return refused.value


def _munge_as(user: str, munged) -> list[tuple[str, str]]:
    cred = subprocess.run(["runuser", "-u", user, "--", "munge", f"--socket={munged}", "-s", MUNGE_PAYLOAD],
                          capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    return [("x-clusterwatch-munge", cred)]


def _view(address: str, job_id: str, user: str, munged) -> query_pb2.JobView | None:
    channel = grpc.insecure_channel(address)
    try:
        return query_pb2_grpc.QueryStub(channel).GetJob(query_pb2.GetJobRequest(job_id=job_id), timeout=20,
                                                        metadata=_munge_as(user, munged))
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.NOT_FOUND:  # before the agent's first samples
            return query_pb2.JobView()
        raise
    finally:
        channel.close()


def test_without_authenticated_queries_no_process_is_asked_unless_the_collector_opts_in(tmp_path):
    collector = Collector(tmp_path)  # --query-auth none
    job_id = unique_job_id()
    trainer = start_trainer(tmp_path, collector.address, job_id, "loop", node="optin-node")
    try:
        wait_for(lambda: trainer.step() is not None, timeout=60, what="a step reported")
        for kind in ("checkpoint", "stop", "dump_stacks", "memory_snapshot"):
            err = _refused(collector.address, job_id, kind)
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED, (kind, err)
            assert FLAG in err.details() and "not authenticated" in err.details(), err.details()
        # the CLI says it in one line, and no rank was asked
        r = cli("diagnose", job_id, "--collector", collector.address, "--no-snapshot")
        assert r.returncode != 0 and FLAG in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not trainer.marker.exists(), "a refused request reached the process"
        assert trainer.rank.popen.poll() is None, "a refused stop stopped the process"
        status = cli("status", job_id, "--collector", collector.address)
        assert status.returncode == 0 and "Requests to the training processes" not in status.stdout, status.stdout
    finally:
        trainer.stop()
        collector.stop()


def test_an_opted_in_collector_without_authentication_acts_and_says_so_at_start(tmp_path):
    collector = Collector(tmp_path, FLAG)
    job_id = unique_job_id()
    trainer = start_trainer(tmp_path, collector.address, job_id, "loop", node="optin-node2")
    try:
        wait_for(lambda: trainer.step() is not None, timeout=60, what="a step reported")
        answer, = _ask(collector.address, job_id, "checkpoint").answers
        assert answer.status == "done" and answer.asked_by == "user (no authentication)", answer
        assert trainer.marker.read_text().strip(), "the handler did not run"
        # on a TCP port every user who reaches it may now act on every job: said once at start
        said = [x for x in collector.text().splitlines() if FLAG in x and "anyone who reaches" in x]
        assert len(said) == 1, collector.text()
    finally:
        trainer.stop()
        collector.stop()


def test_under_munge_seeing_every_job_is_not_acting_on_it(tmp_path, munged):
    collector = Collector(tmp_path, "--query-auth", "munge", "--munge-socket", str(munged), "--show-all-jobs")
    job_id = unique_job_id()
    trainer = start_trainer(tmp_path, collector.address, job_id, "loop", node="optin-node3")
    env = {"CLUSTERWATCH_MUNGE_SOCKET": str(munged)}
    try:
        wait_for(lambda: any(p.HasField("step") for p in _view(collector.address, job_id, "root", munged).processes),
                 timeout=60, what="a step reported")
        # nobody sees the job (--show-all-jobs: PrivateData off) ...
        owner = _view(collector.address, job_id, "nobody", munged).job.user
        assert owner == "root", owner
        # ... but stops, checkpoints and reads the stacks of none of them
        for kind in ("stop", "checkpoint", "dump_stacks"):
            err = _refused(collector.address, job_id, kind, _munge_as("nobody", munged))
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED, (kind, err)
            assert "only its owner or an admin" in err.details() and owner not in err.details(), err.details()
        assert not trainer.marker.exists(), "a refused request reached the process"
        assert trainer.rank.popen.poll() is None, "a refused stop stopped the process"
        # its owner (root) acts
        wait_for(lambda: _ask(collector.address, job_id, "checkpoint", _munge_as("root", munged)
                              ).answers[0].status == "done", timeout=30, what="the owner's checkpoint")
        assert trainer.marker.exists()
        assert cli("status", job_id, "--collector", collector.address, env=env).returncode == 0
    finally:
        trainer.stop()
        collector.stop()


def test_the_pages_of_an_unauthenticated_collector_act_only_when_it_opts_in(tmp_path):
    """The web decides as the query service does: --web-actions offers the actions, but without query
    authentication and without a proxy a browser is nobody in particular, and acts only where the collector
    opts in (--allow-unauthenticated-actions)."""
    import html

    from tests.web_stack import RUNNING_JOB, start_actions_stack

    stack = start_actions_stack(tmp_path, "--web-actions")
    try:
        code, page = stack.request(f"/jobs/{RUNNING_JOB}")
        assert code == 200 and 'id="action-checkpoint"' not in page and FLAG in html.unescape(page), page[:3000]
        code, page = stack.request(f"/jobs/{RUNNING_JOB}/confirm?action=checkpoint")
        assert code == 403 and FLAG in html.unescape(page) and 'name="token"' not in page, page[:3000]
        code, page = stack.request(f"/jobs/{RUNNING_JOB}/act", {"action": "stop", "token": "0" * 72},
                                   {"Origin": stack.url("")})
        assert code == 403 and FLAG in html.unescape(page), page[:3000]
        assert not stack.marker.exists(), "a refused request reached the process"
        assert all(t.rank.popen.poll() is None for t in stack.trainers), "a refused stop stopped a rank"
        assert "Requests to the training processes" not in cli("status", RUNNING_JOB, "--collector",
                                                               stack.collector.address).stdout
    finally:
        stack.stop()


def test_run_keeps_its_own_diagnose(tmp_path):
    """`clusterwatch run`'s collector is its user's alone (a socket in a folder of mode 0700), so it opts in:
    `clusterwatch diagnose` on its socket shows the command's stack."""
    import re
    import sys

    from tests.support.helpers import CLI, clean_environ

    done = tmp_path / "done"
    code = ("import os, time\ndef waiting_for_the_file():\n"
            f"    while not os.path.exists({str(done)!r}): time.sleep(0.1)\nwaiting_for_the_file()")
    proc = subprocess.Popen([*CLI, "run", "--interval", "0.5", "--gpu-source", "none", "--status-every", "0",
                             "--", sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=clean_environ())
    try:
        found = None
        for line in proc.stderr:
            found = re.search(r"watching (local-\d+) .*collector on (unix:\S+)", line)
            if found:
                break
        assert found, f"no watching line; run exited {proc.poll()}"
        job_id, address = found.groups()

        def diagnosed():
            r = cli("diagnose", job_id, "--collector", address, "--no-snapshot", timeout=60)
            return r if r.returncode == 0 else None

        r = wait_for(diagnosed, timeout=60, interval=1, what="diagnose of the run's command")
        assert "waiting_for_the_file" in r.stdout, r.stdout
        done.touch()
        proc.communicate(timeout=90)
        assert proc.returncode == 0
    finally:
        done.touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("caller, owner, acts", [
    (dict(uid=1000, user="alice", admin=False), "alice", True),
    (dict(uid=1001, user="bob", admin=False), "alice", False),
    (dict(uid=1001, user="bob", admin=True), "alice", False),            # --show-all-jobs: sees, does not act
    (dict(uid=1000, user="alice", admin=True), "", False),               # a job with no owner yet: admins' alone
    (dict(uid=0, user="root", admin=True, operator=True), "", True),
    (dict(uid=1002, user="ops", admin=True, operator=True), "alice", True),  # a --query-admin
])
def test_who_may_act_under_munge(caller, owner, acts):
    from clusterwatch.collector.queries.action_rights import why_not_act
    from clusterwatch.collector.queries.auth import Caller

    why = why_not_act(Caller(**caller), owner, "42")
    assert (why == "") is acts, why
    if not acts:
        assert ("no known owner" in why) is (owner == ""), why
        assert "alice" not in why  # the owner is not named
