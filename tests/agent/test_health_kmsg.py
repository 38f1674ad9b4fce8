"""The driver's XID lines in the kernel log, and the /dev/kmsg reader, fed files and FIFOs."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from clusterwatch.agent.health.kmsg import KmsgReader, XidLine, parse_gpu_at, parse_record, parse_xid, pci_key

# Real lines, as public reports quote them (the source beside each).
XID_LINES = [
    # NVIDIA/open-gpu-kernel-modules issue 1150 (driver 590.48.01): pid, name, a cause
    ("NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
     XidLine("0000:dc:00", 45, 1818990, "python3", "Ch 00000001 caused by previous Xid 149")),
    # leptonai/gpud PR 46 (dmesg --ctime): the pid unknown, quoted
    ("[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, "
     "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
     XidLine("0000:cb:00", 13, None, None,
             "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter")),
    ("NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH "
     "TIMEOUT, Info 0x58005",
     XidLine("0000:cb:00", 109, 1797828, "pt_main_thread",
             "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005")),
    # stas00/ml-engineering compute/accelerator/nvidia/debug.md: a pid, no name
    ("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
     XidLine("0000:10:1c", 63, 1896, None, "Row Remapper: New row marked for remapping, reset gpu to activate.")),
    # NVIDIA/open-gpu-kernel-modules issue 1151: XID 79 with neither pid nor name
    ("NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
     XidLine("0000:2b:00", 79, None, None, "GPU has fallen off the bus.")),
    # Bumblebee-Project/Bumblebee issue 677 (2015): an older driver, no pid, with a dmesg stamp
    ("[24128.834365] NVRM: Xid (PCI:0000:01:00): 31, Ch 00000003, engmask 00000101, intr 10000000",
     XidLine("0000:01:00", 31, None, None, "Ch 00000003, engmask 00000101, intr 10000000")),
    # pastebin xJaypMZt (syslog, an old driver): no "PCI:" before the address
    ("Jan 18 11:38:05 localhost kernel: [ 269.517039] NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007 "
     "M 00001ffc Data ffffffff",
     XidLine("0000:01:00", 3, None, None, "C 00000005 SC 00000007 M 00001ffc Data ffffffff")),
    # leptonai/gpud PR 1174: NVLink XIDs of GB200, a PCI domain other than 0
    ("NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 "
     "0x00000000 0x00000000)",
     XidLine("0019:01:00", 149, None, None,
             "NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)")),
    ("NVRM: Xid (PCI:0000:9b:00): 94, pid=1234, name=python3, Contained ECC error",
     XidLine("0000:9b:00", 94, 1234, "python3", "Contained ECC error")),
    # plexus.company/guides/gpu-xid-errors/119 (a GSP timeout): the pid as 'N/A', no name
    ("NVRM: Xid (PCI:0000:65:00): 119, pid='N/A', Timeout waiting for RPC from GSP",
     XidLine("0000:65:00", 119, None, None, "Timeout waiting for RPC from GSP")),
    # the issue's own example: the current form of an XID 79 that knows the process
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
     XidLine("0000:3b:00", 79, 1234, "python", "GPU has fallen off the bus.")),
]


@pytest.mark.parametrize("message, expected", XID_LINES, ids=[str(e.xid) + "-" + e.pci for _, e in XID_LINES])
def test_xid_lines_of_several_driver_generations(message: str, expected: XidLine) -> None:
    # some quotes come through dmesg or syslog, which put a time (and host) before the record's message;
    # /dev/kmsg gives the message alone, and a message that only holds the driver's words is no XID
    prefix, driver, line = message.partition("NVRM: ")
    assert parse_xid(driver + line) == expected
    if prefix:
        assert parse_xid(message) is None


@pytest.mark.parametrize("message", [
    "NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae",
    "NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.",
    "nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping further processing",
    "NVRM: Xid (PCI:zz:2b:00): 79, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:2b:00): seventy-nine",
    "",
])
def test_other_kernel_lines_are_no_xid(message: str) -> None:
    assert parse_xid(message) is None


def test_the_driver_names_the_gpu_at_an_address() -> None:
    assert parse_gpu_at("NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae") == (
        "0000:2b:00", "GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae")
    assert parse_gpu_at("NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.") is None


@pytest.mark.parametrize("address, key", [("00000000:3B:00.0", "0000:3b:00"), ("0000:3b:00", "0000:3b:00"),
                                          ("PCI:0019:01:00", "0019:01:00"), ("3b:00", None), ("x:y:z", None)])
def test_bus_addresses_of_nvml_and_the_driver_compare_equal(address: str, key: str | None) -> None:
    assert pci_key(address) == key


def test_kmsg_records() -> None:
    rec = parse_record("4,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n")
    assert (rec.priority, rec.seq, rec.usec) == (4, 1234, 5678901)
    assert rec.message == "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."
    # a caller field (CONFIG_PRINTK_CALLER) and an escaped byte
    rec = parse_record(r"6,7,8,c,caller=T42;a\x09b")
    assert (rec.seq, rec.message) == (7, "a\tb")
    assert parse_record(" SUBSYSTEM=pci") is None   # a dictionary line
    assert parse_record("no header here") is None
    assert parse_record("x,1,2,-;msg") is None


def _collect(path: Path, **kw):
    got = []
    reader = KmsgReader(str(path), got.append, boot_time=1_000_000.0, wait_s=0.05, **kw)
    return reader, got


def _wait_for(pred, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_reader_reads_the_log_from_boot_then_as_it_grows(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text(
        "6,1,1000000,-;Linux version 6.8.0\n"
        " SUBSYSTEM=pci\n"
        "4,2,2000000,-;NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae\n"
        "3,3,2500000,-;NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n"
        "garbage\n")
    reader, got = _collect(log, resolve_pci={"0000:3b:00": "GPU-aaaa"}.get)
    reader.start()
    try:
        _wait_for(lambda: len(got) == 1)
        with log.open("a") as f:
            f.write("3,4,9000000,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=77, name=python, Graphics Exception\n")
        _wait_for(lambda: len(got) == 2)
    finally:
        reader.stop()
    first, second = got
    # the UUID from the driver's own line, NVML not knowing the address
    assert (first.uuid, first.xid, first.pid, first.time, first.seq) == (
        "GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae", 79, None, 1_000_002.5, 3)
    assert (second.uuid, second.xid, second.pid, second.process) == ("GPU-aaaa", 13, 77, "python")
    assert reader.bad_records == 1
    assert reader.records == 4


def test_the_reader_takes_records_from_a_fifo_and_stops_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "kmsg.fifo"
    os.mkfifo(fifo)
    reader, got = _collect(fifo)
    reader.start()
    try:
        writer = os.open(fifo, os.O_WRONLY)
        os.write(writer, b"3,9,5000000,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=5, name=train, DBE\n")
        _wait_for(lambda: len(got) == 1)
        t0 = time.monotonic()
        stopper = threading.Thread(target=reader.stop)
        stopper.start()
        stopper.join(10)
        assert not stopper.is_alive()
        assert time.monotonic() - t0 < 5.0   # generous: a wait lasts 0.05 s
        os.close(writer)
    finally:
        reader.stop()
    assert got[0].xid == 48 and got[0].uuid is None and got[0].pid == 5


def test_an_unreadable_log_is_one_line_at_start(tmp_path: Path) -> None:
    with pytest.raises(OSError) as err:
        KmsgReader(str(tmp_path / "missing"), lambda e: None)
    assert "cannot read the kernel log" in str(err.value) and "--kmsg none" in str(err.value)


def test_the_reader_thread_carries_its_name_for_top(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text("")
    reader, _ = _collect(log)
    reader.start()
    try:
        def names() -> set[str]:
            return {Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task")}
        _wait_for(lambda: "cw-kmsg" in names())
    finally:
        reader.stop()


# Kernel-log records whose text a user controls, each shaped as the kernel or a writer of /dev/kmsg makes
# it, every one carrying the driver's own words: none is an XID (nor teaches a GPU's address), and the
# real XID after them is still read. USEC 2500000 throughout; the priority is facility * 8 + level.
_DRIVER_LINE = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
HOSTILE_RECORDS = [
    # `echo ... > /dev/kmsg` and logger --kmsg: the kernel gives such records the user facility (1)
    ("written to /dev/kmsg by a user", f"11,101,2500000,-;{_DRIVER_LINE}"),
    ("written to /dev/kmsg with a <level> prefix", f"14,102,2500000,-;{_DRIVER_LINE}"),
    # syslog daemons and journald forwarding: facility daemon (3) or syslog (5)
    ("forwarded from syslog (daemon)", f"27,103,2500000,-;{_DRIVER_LINE}"),
    ("forwarded from syslog (syslog)", f"46,104,2500000,-;{_DRIVER_LINE}"),
    # the OOM killer's summary names the cgroups, whose names the job's user chooses
    ("a cgroup name in an OOM report",
     "6,105,2500000,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
     f"oom_memcg=/slurm/uid_1000/job_5/{_DRIVER_LINE},task_memcg=/slurm/uid_1000/job_5/step_0,task=python,"
     "pid=4242,uid=1000"),
    ("a cgroup name in the OOM killer's memory stats",
     f"6,106,2500000,-;Memory cgroup stats for /slurm/uid_1000/job_5/{_DRIVER_LINE}:"),
    # a process name (comm, 15 bytes at most) where the kernel starts a message with it
    ("a process named like the driver, segfaulting", "6,107,2500000,-;NVRM: Xid (PCI[4242]: segfault at 0 "
     "ip 0000000000401136 sp 00007ffd4a1c2f40 error 6 in a.out[401000+1000]"),
    ("a process named like the driver, OOM-killed", "3,108,2500000,-;Out of memory: Killed process 4242 "
     "(NVRM: Xid (PCI) total-vm:1048576kB, anon-rss:1000000kB, file-rss:0kB, shmem-rss:0kB, UID:1000"),
    # a user's string with a newline in it, escaped by /dev/kmsg as \x0a: the driver's line after it
    ("a newline in a user's file name", "5,109,2500000,-;audit: type=1400 audit(1700000000.000:42): "
     f'apparmor="DENIED" operation="open" name="/tmp/x\\x0a{_DRIVER_LINE}" comm="cat"'),
    # the dictionary lines after a record (KEY=value), which a device's or a user's text can fill
    ("a continuation line", f" {_DRIVER_LINE}"),
    ("a continuation line's value", f" SUBSYSTEM={_DRIVER_LINE}"),
    # the driver's line naming a GPU, from a user: it must not send the real XID to another GPU
    ("a GPU's address claimed by a user", "12,110,2500000,-;NVRM: GPU at PCI:0000:3b:00: GPU-evil"),
    ("a GPU's address in a cgroup name",
     "6,111,2500000,-;Memory cgroup stats for /slurm/job_5/NVRM: GPU at PCI:0000:3b:00: GPU-evil2:"),
]


@pytest.mark.parametrize("record", [r for _, r in HOSTILE_RECORDS], ids=[n for n, _ in HOSTILE_RECORDS])
def test_text_a_user_can_put_in_the_kernel_log_is_no_xid(record: str, tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text("")
    reader, got = _collect(log)
    try:
        assert reader.feed(record) is None
        # the real XID that follows is the driver's, on no GPU a user named
        event = reader.feed("3,200,2600000,-;NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error")
    finally:
        reader.stop()
    assert [(e.xid, e.uuid) for e in got] == [(48, None)] and event is got[0]


def test_the_reader_takes_only_the_kernels_own_xids_from_a_log_full_of_user_text(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text("".join(r + "\n" for _, r in HOSTILE_RECORDS) +
                   "3,200,2600000,-;NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error\n")
    reader, got = _collect(log)
    reader.start()
    try:
        _wait_for(lambda: reader.records >= len(HOSTILE_RECORDS) - 1)
    finally:
        reader.stop()
    assert [(e.xid, e.pci, e.uuid, e.seq) for e in got] == [(48, "0000:3b:00", None, 200)]
    assert reader.not_kernel == 5 and reader.bad_records == 0
