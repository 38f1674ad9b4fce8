"""Requests back to a training process, end to end (issue 16 items 2-3): a real collector, a real agent and a
real Python process using clusterwatch.train (tests/support/trainers.py). A `checkpoint` asked through the collector
reaches the process's handler and its answer shows in `status`; `clusterwatch diagnose` on a process blocked
in a function prints that function in the grouped stacks; a user who does not own the job is refused."""
from __future__ import annotations

import json
import subprocess
import sys

import grpc
import pytest
from clusterwatch.cli.common import MUNGE_PAYLOAD
from clusterwatch.v1 import query_pb2, query_pb2_grpc

from tests.support.helpers import CLI, Collector, Proc, clean_environ, cli, wait_for
from tests.support.short_leak_rules import short_leak_rules
from tests.support.trainers import start_trainer

pytestmark = pytest.mark.e2e


class Job:
    """A collector (with `collector_args`) and one trainer of tests/support/trainers.py in `mode`, as job `job_id`."""

    def __init__(self, tmp_path, mode: str, job_id: str, *collector_args: str) -> None:
        self.job_id = job_id
        self.collector = Collector(tmp_path, *collector_args)
        self.trainer = start_trainer(tmp_path, self.collector.address, job_id, mode, node="dg-node")
        self.rank, self.marker = self.trainer.rank, self.trainer.marker

    def status(self) -> str:
        r = cli("status", self.job_id, "--collector", self.collector.address)
        assert r.returncode == 0, r.stderr
        return r.stdout

    def ask(self, kind: str, metadata=None) -> query_pb2.AskTrainingResponse:
        channel = grpc.insecure_channel(self.collector.address)
        try:
            return query_pb2_grpc.QueryStub(channel).AskTraining(
                query_pb2.AskTrainingRequest(job_id=self.job_id, kind=kind, timeout_s=10), timeout=20,
                metadata=metadata)
        finally:
            channel.close()

    def stop(self) -> None:
        self.trainer.stop()
        self.collector.stop()


# Queries unauthenticated (the suite's default): the collector opts in to its callers' asks.
OPT_IN = "--allow-unauthenticated-actions"


def test_a_checkpoint_request_reaches_the_handler_and_its_answer_shows_in_status(tmp_path):
    job = Job(tmp_path, "loop", "dg-1", OPT_IN)
    try:
        # the process must have reported for the agent to know where to ask it
        wait_for(lambda: job.trainer.step() is not None, timeout=60, what="a step reported")
        resp = job.ask("checkpoint")
        assert len(resp.answers) == 1, resp
        answer = resp.answers[0]
        assert answer.status == "done", answer
        assert answer.pid == job.rank.pid and answer.message.startswith("saved checkpoint at step ")
        assert answer.asked_by.startswith("user ")
        assert job.marker.read_text().strip(), "the handler did not run"
        text = job.status()
        assert "Requests to the training processes" in text, text
        line = _entry(text, "checkpoint done")
        assert line and "saved checkpoint at step" in line, text
        document = json.loads(cli("status", "dg-1", "--collector", job.collector.address, "--json").stdout)
        assert [a["status"] for a in document["train_answers"]] == ["done"]
    finally:
        job.stop()


def test_diagnose_prints_the_function_a_stuck_rank_is_blocked_in(tmp_path):
    job = Job(tmp_path, "stuck", "dg-2", OPT_IN)
    try:
        job.trainer.stepping()
        job.trainer.stuck()  # blocked in blocked_in_collective
        r = cli("diagnose", "dg-2", "--collector", job.collector.address, timeout=60)
        assert r.returncode == 0, r.stderr + r.stdout
        stacks = r.stdout.split("Memory snapshots")[0]
        assert "blocked_in_collective" in stacks, r.stdout
        # one group, by pid (the agent was given the pid, not a rank), in the function it is blocked in
        assert f"\n  pid {job.rank.pid} in blocked_in_collective at trainer.py:" in stacks, r.stdout
        # the stuck rank accepts the snapshot request but never runs it (its loop is stuck): said so
        snapshots = r.stdout.split("Memory snapshots")[1]
        assert "memory_snapshot" in snapshots and ("accepted" in snapshots or "no answer" in snapshots), r.stdout
        js = cli("diagnose", "dg-2", "--collector", job.collector.address, "--json", "--no-snapshot", timeout=60)
        assert js.returncode == 0, js.stderr
        document = json.loads(js.stdout)
        assert document["schema"] == "clusterwatch.diagnose/1"
        assert any("blocked_in_collective" in g for g in document["stack_groups"]), document
        assert document["stacks"][0]["status"] == "done" and document["snapshots"] == []
    finally:
        job.stop()


def _munge_as(user: str, munged, *args: str) -> str:
    return subprocess.run(["runuser", "-u", user, "--", "munge", f"--socket={munged}", *args],
                          capture_output=True, text=True, timeout=30, check=True).stdout.strip()


def test_a_user_who_does_not_own_the_job_is_refused(tmp_path, munged):
    job = Job(tmp_path, "loop", "dg-3", "--query-auth", "munge", "--munge-socket", str(munged))
    env = {"CLUSTERWATCH_MUNGE_SOCKET": str(munged)}
    try:
        wait_for(lambda: cli("status", "dg-3", "--collector", job.collector.address, env=env).returncode == 0,
                 timeout=60, what="the job")
        nobody = [("x-clusterwatch-munge", _munge_as("nobody", munged, "-s", MUNGE_PAYLOAD))]
        with pytest.raises(grpc.RpcError) as refused:
            job.ask("checkpoint", metadata=nobody)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value
        assert "not yours" in refused.value.details()
        assert not job.marker.exists(), "the request reached the process"
        # its owner (root here) is answered
        owner = [("x-clusterwatch-munge", _munge_as("root", munged, "-s", MUNGE_PAYLOAD))]
        wait_for(lambda: job.ask("checkpoint", metadata=[("x-clusterwatch-munge", _munge_as(
            "root", munged, "-s", MUNGE_PAYLOAD))]).answers[0].status == "done", timeout=30, what="the owner's ask")
        assert owner and job.marker.exists()
    finally:
        job.stop()


LEAKING_TRAINER = r"""
import sys, time
from clusterwatch import train
marker = sys.argv[1]
step = 0

def checkpoint(request):
    open(marker, "w").write(f"checkpoint at step {step}")
    return f"saved checkpoint at step {step}"

train.on_request("checkpoint", checkpoint)
hoard = []
for i in range(2000):
    step = i
    block = bytearray(4 * 1024 * 1024)
    block[::4096] = b"x" * len(block[::4096])
    hoard.append(block)
    train.report(step=step, loss=1.0)
    time.sleep(0.25)
"""


def test_an_alerts_checkpoint_step_reaches_the_handler_ahead_of_signals_and_shows_in_status(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text(short_leak_rules()
                     + '\n[actions]\n\n[[actions.steps]]\naction = "checkpoint"\nrules = ["host_memory_leak"]\n')
    marker = tmp_path / "checkpointed"
    sock = tmp_path / "train.sock"
    collector = Collector(tmp_path, "--rules", str(rules), "--history-step", "0")
    leaker = Proc([sys.executable, "-c", LEAKING_TRAINER, str(marker)], tmp_path / "leaker.log",
                  env={**clean_environ(), "CLUSTERWATCH_TRAIN_SOCKET": str(sock)})
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "leak-node", "--interval", "0.5",
                  "--send-interval", "0",
                  "--gpu-source", "none", "--pid", str(leaker.pid), "--job-id", "leak-2", "--no-provenance",
                  "--spool-dir", str(tmp_path / "spool"), "--train-socket", str(sock)], tmp_path / "agent.log")
    try:
        wait_for(marker.exists, timeout=150, what="the alert's checkpoint step to reach the handler")
        assert marker.read_text().startswith("checkpoint at step ")

        def line() -> str | None:
            r = cli("status", "leak-2", "--collector", collector.address)
            return _entry(r.stdout, "checkpoint done")

        shown = wait_for(line, timeout=30, what="the answer in status")
        assert "host_memory_leak" in shown and "asked by alert " in shown and "saved checkpoint at step" in shown
    finally:
        for p in (agent, leaker, collector):
            p.stop()


def _entry(report: str, needle: str) -> str | None:
    """The report's entry holding `needle`, its wrapped lines joined (the report keeps to 80 columns)."""
    lines = report.splitlines()
    for i, line in enumerate(lines):
        if needle in line:
            indent = len(line) - len(line.lstrip())
            tail = []
            for more in lines[i + 1:]:
                if not more.strip() or len(more) - len(more.lstrip()) <= indent:
                    break
                tail.append(more.strip())
            return " ".join([line.strip(), *tail])
    return None
