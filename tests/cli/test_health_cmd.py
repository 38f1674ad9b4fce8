"""`clusterwatch health [NODE]`: the GPUs with health findings, worst first, for operators; refused to others.

A real collector with munge-identified queries (a real munged), a real agent over the real pynvml and the C
stand-in for the driver: GPU 0 had an XID 48 and holds uncorrected ECC errors; GPU 1 is healthy.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import grpc
import jsonschema
import pytest
from clusterwatch.cli.common import MUNGE_PAYLOAD
from clusterwatch.v1 import query_pb2, query_pb2_grpc

from tests.fakes.nvml_stub import child_env, fixtures, write_state
from tests.support.helpers import CLI, ROOT, Collector, Proc, cli, kmsg_record, wait_for

pytestmark = pytest.mark.e2e
stub_lib = fixtures.stub_lib  # the stand-in's fixture, used by name
NODE = "hc-node"


def test_health_lists_the_troubled_gpu_for_admins_only(stub_lib: Path, tmp_path: Path, munged) -> None:
    state = tmp_path / "nvml-state.txt"
    write_state(state, "gpu GPU-hc0 total=85899345920 used=0 util=0 power=90000 pci=0000:3b:00 temp=83 "
                       "throttle=0x8 name=NVIDIA H100\n"
                       "gpu GPU-hc1 total=85899345920 used=0 util=0 power=70000 pci=0000:3c:00 name=NVIDIA H100\n"
                       "ecc GPU-hc0 uncorrected_volatile=4 uncorrected_aggregate=4\n")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(kmsg_record(1, "NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error"))
    collector = Collector(tmp_path, "--query-auth", "munge", "--munge-socket", str(munged))
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", NODE, "--gpu-source", "nvml",
                  "--interval", "0.5", "--send-interval", "0", "--no-provenance",
                  "--spool-dir", str(tmp_path / "spool"), "--train-socket", str(tmp_path / "train.sock"),
                  "--kmsg", str(kmsg)],
                 tmp_path / "agent.log", env=child_env(stub_lib, state))
    env = {"CLUSTERWATCH_MUNGE_SOCKET": str(munged)}
    try:
        def listed():
            r = cli("health", "--collector", collector.address, "--json", env=env)
            doc = json.loads(r.stdout) if r.returncode == 0 else {}
            gpus = doc.get("gpus", [])
            ready = gpus and gpus[0]["xids"] and gpus[0]["ecc_uncorrected_volatile"] and len(gpus[0]["findings"]) >= 2
            return doc if ready else None

        doc = wait_for(listed, timeout=60, what="the troubled GPU in clusterwatch health --json")
        assert doc["schema"] == "clusterwatch.health/1"
        schema = json.loads((ROOT / "docs" / "json" / "clusterwatch.schema.json").read_text())
        assert [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(doc)] == []
        [gpu] = doc["gpus"]  # the healthy GPU is not listed
        assert (gpu["node"], gpu["gpu"], gpu["index"], gpu["severity"]) == (NODE, "GPU-hc0", 0, "critical")
        assert gpu["xids"] == [{"xid": 48, "count": 1}] and gpu["ecc_uncorrected_volatile"] == 4
        assert gpu["temperature_c"] == 83 and gpu["throttle_reasons"] == ["hw_slowdown"]
        assert {f["rule"] for f in gpu["findings"]} >= {"gpu_xid", "gpu_memory_errors"}
        text = cli("health", "--collector", collector.address, env=env)
        assert text.returncode == 0, text.stderr
        lines = text.stdout.splitlines()
        assert lines[0].split()[:3] == ["SEVERITY", "NODE", "GPU"]
        assert lines[1].split()[:3] == ["critical", NODE, "0"]
        assert "XID 48" in lines[1] and "4 uncorrected ECC" in lines[1]
        assert "GPU-hc1" not in text.stdout and "Double bit ECC error" in text.stdout
        mine = cli("health", NODE, "--collector", collector.address, env=env)
        assert mine.returncode == 0 and mine.stdout.splitlines()[1].split()[:2] == ["critical", NODE], mine.stderr
        # a node no agent reports as is not a node whose GPUs are all well
        other = cli("health", "other-node", "--collector", collector.address, env=env)
        assert (other.returncode, other.stdout) == (1, ""), other.stderr
        assert other.stderr.startswith("clusterwatch: unknown node 'other-node': no agent of that name reports to "
                                       "this collector"), other.stderr
        # a user who is not an admin: refused, with what to use instead
        cred = subprocess.run(["runuser", "-u", "nobody", "--", "munge", f"--socket={munged}", "-s", MUNGE_PAYLOAD],
                              capture_output=True, text=True, timeout=30, check=True).stdout.strip()
        channel = grpc.insecure_channel(collector.address)
        try:
            query_pb2_grpc.QueryStub(channel).ListHealth(query_pb2.ListHealthRequest(), timeout=10,
                                                         metadata=[("x-clusterwatch-munge", cred)])
            raise AssertionError("nobody was given the GPUs' health")
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "for the cluster's operators" in err.details() and "clusterwatch status JOBID" in err.details()
        finally:
            channel.close()
    finally:
        agent_code = agent.stop()
        collector.stop()
    assert agent_code == 0, agent.text()
