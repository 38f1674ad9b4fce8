"""A user's tmpfs files (/dev/shm, /run, ...) count for the user's running jobs on the node, but root's never:
on a node they are the machine's (systemd's, the agents', other suites'), so a job run as root is given no figure
rather than every root-owned file of the machine (collector/state/tmpfs.py)."""
from __future__ import annotations

from clusterwatch.collector.state.cluster import JobState, NodeState
from clusterwatch.collector.state.tmpfs import job_tmpfs, take_tmpfs_scan
from clusterwatch.v1 import agent_pb2

MIB = 1 << 20


def _walked(*uses: tuple[int, str, int]) -> NodeState:
    ns = NodeState("node1")
    scan = agent_pb2.TmpfsScan(time=100.0)
    for uid, user, held in uses:
        scan.uses.add(uid=uid, user=user, bytes=held, files=3)
    take_tmpfs_scan(ns, scan)
    return ns


def test_root_files_are_counted_for_no_job_and_a_users_files_for_the_users_job():
    ns = _walked((0, "root", 300 * MIB), (1000, "alice", 40 * MIB))
    assert ns.tmpfs_by_user == {"alice": 40 * MIB}  # root's are not kept
    assert job_tmpfs(ns, JobState("42", user="alice", nodes=["node1"])) == 40 * MIB
    assert job_tmpfs(ns, JobState("43", user="root", nodes=["node1"])) is None
    assert job_tmpfs(ns, JobState("44", user="bob", nodes=["node1"])) == 0  # walked: bob holds nothing


def test_an_unnamed_uid_0_is_root_too():
    ns = _walked((0, "", 300 * MIB), (1001, "", 5 * MIB))
    assert ns.tmpfs_by_user == {"1001": 5 * MIB}
    assert job_tmpfs(ns, JobState("45", user="0", nodes=["node1"])) is None
    assert job_tmpfs(ns, JobState("46", user="1001", nodes=["node1"])) == 5 * MIB
