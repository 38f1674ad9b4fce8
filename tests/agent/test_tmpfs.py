"""The agent's tmpfs walk (agent/tmpfs.py): what users' files hold in /dev/shm, bounded, never following a link."""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest
from clusterwatch.agent.tmpfs import TmpfsScanner, scan_tmpfs, tmpfs_mounts, tmpfs_scan_to_proto
from clusterwatch.v1 import agent_pb2

MOUNTS = """\
sysfs /sys sysfs rw,nosuid 0 0
tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0
tmpfs /sys/fs/cgroup tmpfs ro,mode=755 0 0
tmpfs /run/user/1000 tmpfs rw,nosuid,size=1g 0 0
tmpfs /mnt/with\\040space tmpfs rw 0 0
tmpfs /opt/ro tmpfs ro,relatime 0 0
tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0
/dev/sda1 / ext4 rw 0 0
"""


def test_the_mounts_are_the_writable_tmpfs_ones_each_once_kernel_interfaces_left_out():
    assert tmpfs_mounts(MOUNTS) == ["/dev/shm", "/run/user/1000", "/mnt/with space"]


@pytest.fixture
def shm_dir():
    """A folder of our own under /dev/shm, removed after (the walk is given it as its mount)."""
    if not os.path.isdir("/dev/shm"):
        pytest.fail("this test needs /dev/shm (a tmpfs), which every Linux node has")
    d = Path("/dev/shm") / f"cw-test-{uuid.uuid4().hex}"
    d.mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_files_count_by_allocated_blocks_once_per_inode_and_links_fifos_are_never_followed(shm_dir: Path):
    (shm_dir / "data").write_bytes(b"x" * (3 << 20))
    os.link(shm_dir / "data", shm_dir / "hardlink")  # the same pages: counted once
    with open(shm_dir / "sparse", "wb") as f:  # 1 GiB long, 4 KiB held
        f.truncate(1 << 30)
        f.write(b"y" * 4096)
    os.symlink("/etc/shadow", shm_dir / "shadow")  # a link is a link: never stat'ed through, never opened
    os.symlink("/", shm_dir / "root")  # nor walked into
    os.mkfifo(shm_dir / "fifo")  # opening it would block the walk for ever
    (shm_dir / "sub" / "deeper").mkdir(parents=True)
    (shm_dir / "sub" / "deeper" / "f").write_bytes(b"z" * 8192)
    (shm_dir / "bad\nname\xff".encode("utf-8", "surrogateescape").decode("utf-8", "surrogateescape")).write_bytes(
        b"w" * 4096)
    scan = scan_tmpfs([str(shm_dir)])
    me = scan.by_uid[os.getuid()]
    assert me.bytes == (3 << 20) + 4096 + 8192 + 4096
    assert me.files == 4  # data (once), sparse, sub/deeper/f, the odd name
    assert not scan.truncated and scan.errors == 0
    assert list(scan.by_uid) == [os.getuid()]  # /etc/shadow's owner (root) is never counted through the link


def test_a_million_file_folder_stops_at_the_bound_and_says_so(shm_dir: Path):
    many = shm_dir / "many"
    many.mkdir()
    for i in range(3000):  # the bound scaled down: the walk of a million stops the same way, at max_files
        (many / str(i)).touch()
    scan = scan_tmpfs([str(shm_dir)], max_files=1000)
    assert scan.truncated and scan.entries == 1000
    deep = shm_dir / "d"
    (deep / "a" / "b" / "c" / "d").mkdir(parents=True)
    (deep / "a" / "b" / "c" / "d" / "f").write_bytes(b"q" * 4096)
    shallow = scan_tmpfs([str(deep)], max_depth=2)
    assert shallow.truncated and os.getuid() not in shallow.by_uid
    assert scan_tmpfs([str(deep)], max_depth=8).by_uid[os.getuid()].bytes == 4096


def test_the_scanner_hands_each_walk_once_and_the_proto_names_the_users(shm_dir: Path):
    (shm_dir / "f").write_bytes(b"x" * 8192)
    scanner = TmpfsScanner(mounts=[str(shm_dir)], clock=lambda: 123.0)
    assert scanner.take() is None
    scanner.scan_now()
    scan = scanner.take()
    assert scan is not None and scanner.take() is None
    out = agent_pb2.TmpfsScan()
    tmpfs_scan_to_proto(scan, out)
    assert out.time == 123.0 and [(u.uid, u.bytes, u.files) for u in out.uses] == [(os.getuid(), 8192, 1)]
    import pwd

    assert out.uses[0].user == pwd.getpwuid(os.getuid()).pw_name
