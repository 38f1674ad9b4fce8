"""`clusterwatch health --history [NODE]`: what clusterwatch did on its own, newest first, for operators only.

A real collector with munge-identified queries (a real munged) and a rules file that notifies (a command step)
and drains (no --slurm: the drain is skipped, and says why) on gpu_xid; a real agent over the real pynvml and
the C stand-in for the driver, whose kernel log has an XID 48.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import grpc
import jsonschema
import pytest
from clusterwatch.cli.common import MUNGE_PAYLOAD
from clusterwatch.v1 import actions_pb2, actions_pb2_grpc

from tests.fakes.nvml_stub import child_env, fixtures, write_state
from tests.support.helpers import CLI, ROOT, Collector, Proc, cli, kmsg_record, wait_for

pytestmark = pytest.mark.e2e
stub_lib = fixtures.stub_lib  # the stand-in's fixture, used by name
NODE = "hh-node"

RULES = """\
[[actions.steps]]
action = "command"
rules = ["gpu_xid"]
command = ["true"]

[[actions.steps]]
action = "drain"
rules = ["gpu_xid"]
"""


def test_history_lists_the_automatic_actions_for_admins_only(stub_lib: Path, tmp_path: Path, munged) -> None:
    state = tmp_path / "nvml-state.txt"
    write_state(state, "gpu GPU-hh0 total=85899345920 used=0 util=0 power=90000 pci=0000:3b:00 serial=1652922001234 "
                "name=NVIDIA H100\n")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(kmsg_record(1, "NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error"))
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES)
    collector = Collector(tmp_path, "--query-auth", "munge", "--munge-socket", str(munged), "--rules", str(rules))
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", NODE, "--gpu-source", "nvml",
                  "--interval", "0.5", "--send-interval", "0", "--no-provenance",
                  "--spool-dir", str(tmp_path / "spool"), "--train-socket", str(tmp_path / "train.sock"),
                  "--kmsg", str(kmsg)],
                 tmp_path / "agent.log", env=child_env(stub_lib, state))
    env = {"CLUSTERWATCH_MUNGE_SOCKET": str(munged)}
    try:
        def both_done():
            r = cli("health", "--history", "--collector", collector.address, "--json", env=env)
            doc = json.loads(r.stdout) if r.returncode == 0 else {}
            got = {(a["action"], a["outcome"]) for a in doc.get("actions", [])}
            return doc if got == {("command", "done"), ("drain", "skipped")} else None

        doc = wait_for(both_done, timeout=60, what="the notification and the drain in health --history --json")
        assert doc["schema"] == "clusterwatch.health_history/1"
        schema = json.loads((ROOT / "docs" / "json" / "clusterwatch.schema.json").read_text())
        assert [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(doc)] == []
        by_action = {a["action"]: a for a in doc["actions"]}
        drain = by_action["drain"]
        assert (drain["node"], drain["rule"], drain["job_id"]) == (NODE, "gpu_xid", None)
        assert "--slurm" in drain["detail"] and drain["why"].startswith("gpu_xid: ")
        assert [a["time"] for a in doc["actions"]] == sorted((a["time"] for a in doc["actions"]), reverse=True)
        # the repeat offenders: the GPU (with its board's serial, from the agent's inventory) and its node, one
        # finding each, no job hurt, no drain done
        assert doc["gpus"] == [{"node": NODE, "gpu": "GPU-hh0", "findings": 1, "drains": 0, "jobs_hurt": 0,
                                "mtbf_s": None, "serial": "1652922001234", "jobs_held": 0}]
        assert doc["nodes"] == [{"node": NODE, "gpu": None, "findings": 1, "drains": 0, "jobs_hurt": 0,
                                 "mtbf_s": None, "serial": None, "jobs_held": 0}]

        # a second XID later in the kernel log (the GPU lost): two findings, and the mean time between them
        with kmsg.open("a") as f:
            f.write(kmsg_record(2, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."))

        def two_findings():
            r = cli("health", "--history", "--collector", collector.address, "--json", env=env)
            found = json.loads(r.stdout) if r.returncode == 0 else {}
            return found if [g["findings"] for g in found.get("gpus", [])] == [2] else None

        doc = wait_for(two_findings, timeout=60, what="the second finding in health --history --json's gpus")
        assert [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(doc)] == []
        [gpu], [node] = doc["gpus"], doc["nodes"]
        assert gpu["mtbf_s"] is not None and 0 < gpu["mtbf_s"] < 60 and node["mtbf_s"] == gpu["mtbf_s"]
        # and on /metrics: the node's findings by rule and the GPU's; no drain done, nothing flagged
        metrics = collector.metrics()
        # (the XID 79 is the GPU lost; the gpu_xid alert of the XID 48 stands, so it is no new gpu_xid finding)
        assert f'clusterwatch_node_health_findings{{node="{NODE}",rule="gpu_xid"}} 1.0\n' in metrics, metrics
        assert f'clusterwatch_node_health_findings{{node="{NODE}",rule="gpu_lost"}} 1.0\n' in metrics
        assert f'clusterwatch_gpu_health_findings{{gpu="GPU-hh0",node="{NODE}"}} 2.0\n' in metrics
        assert "clusterwatch_node_drains{" not in metrics and "clusterwatch_gpu_repeat_offender{" not in metrics

        text = cli("health", "--history", NODE, "--collector", collector.address, env=env)
        assert text.returncode == 0, text.stderr
        lines = text.stdout.splitlines()
        assert lines[0].split() == ["WHEN", "ACTION", "NODE", "JOB", "OUTCOME"]
        rows = [line.split()[2:] for line in lines[1:] if line[:4].isdigit()]  # past the date and time
        assert sorted(rows) == [["command", NODE, "-", "done"], ["drain", NODE, "-", "skipped"]], text.stdout
        assert "why: gpu_xid: " in text.stdout
        ranking = lines[lines.index("REPEAT OFFENDERS (findings of 90 days; JOBS: hurt/held; MTBF: between findings)"):]
        assert max(len(line) for line in ranking) <= 80, text.stdout
        assert ranking[1].split() == ["GPU", "NODE", "FINDINGS", "JOBS", "MTBF"]
        gpu_row = ranking[2].split()
        assert gpu_row[:4] == ["GPU-hh0", NODE, "2", "0/0"] and gpu_row[-1] == "s", text.stdout  # "N s"
        assert ranking[3].split() == ["serial", "1652922001234"], text.stdout
        assert ranking[4].split() == ["NODE", "FINDINGS", "DRAINS", "JOBS", "MTBF"]
        assert ranking[5].split()[:4] == [NODE, "2", "0", "0/0"], text.stdout
        # another node's history is empty, not an error (a node drained and since removed still has one)
        other = cli("health", "--history", "other-node", "--collector", collector.address, env=env)
        assert (other.returncode, other.stdout) == (
            0, "no automatic action recorded\nno health finding kept (repeat offenders: none)\n"), other.stderr

        # a user who is not an admin: refused
        cred = subprocess.run(["runuser", "-u", "nobody", "--", "munge", f"--socket={munged}", "-s", MUNGE_PAYLOAD],
                              capture_output=True, text=True, timeout=30, check=True).stdout.strip()
        channel = grpc.insecure_channel(collector.address)
        try:
            actions_pb2_grpc.ActionsStub(channel).ListActions(actions_pb2.ListActionsRequest(), timeout=10,
                                                              metadata=[("x-clusterwatch-munge", cred)])
            raise AssertionError("nobody was given the automatic actions")
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "for the cluster's operators" in err.details()
        finally:
            channel.close()
    finally:
        agent_code = agent.stop()
        collector.stop()
    assert agent_code == 0, agent.text()
