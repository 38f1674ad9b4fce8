"""Table tests of the pure Slurm parsers against real and documented outputs (tests/fixtures/scontrol)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from clusterwatch.errors import ParseError
from clusterwatch.slurm import hostlist
from clusterwatch.slurm.listpids import PidEntry, parse_listpids
from clusterwatch.slurm.proc import CgroupJob, EnvLabels, environ_labels, parse_cgroup, parse_environ
from clusterwatch.slurm.scontrol import parse_duration, parse_gres_detail, parse_show_job
from tests.support.helpers import TESTS

FIXTURES = TESTS / "fixtures" / "scontrol"
UTC = timezone.utc
MIB = 1024 * 1024


def utc(text: str) -> int:
    return int(datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp())


# ------------------------------------------------------------------------------------------- hostlists

EXPAND_TABLE = [
    ("n[1-2]", ["n1", "n2"]),
    ("gpu[001-004,010]", ["gpu001", "gpu002", "gpu003", "gpu004", "gpu010"]),
    ("rack[0-1]_blade[0-2]", [f"rack{r}_blade{b}" for r in range(2) for b in range(3)]),
    ("a,b[1-3],c", ["a", "b1", "b2", "b3", "c"]),
    ("node[09-11]", ["node09", "node10", "node11"]),
    ("x[7]", ["x7"]),
    ("lx[15,18,32-33]", ["lx15", "lx18", "lx32", "lx33"]),
    ("linux[0000-0002]", ["linux0000", "linux0001", "linux0002"]),
    ("node-[63-65]", ["node-63", "node-64", "node-65"]),
    ("cn[1-2].cluster.org", ["cn1.cluster.org", "cn2.cluster.org"]),
    ("", []),
    ("  n1  ", ["n1"]),
    ("n1,n1", ["n1", "n1"]),
]


@pytest.mark.parametrize(("expr", "hosts"), EXPAND_TABLE)
def test_expand(expr: str, hosts: list[str]) -> None:
    assert hostlist.expand(expr) == hosts


@pytest.mark.parametrize(
    "expr",
    ["n[1-2", "n1-2]", "n[[1]]", "n[2-1]", "n[a-b]", "n[]", "n[1-]", "a,,b", "n[1,]", "a b", "n[1-2,x]", ","],
)
def test_expand_rejects_bad_input_with_one_line(expr: str) -> None:
    with pytest.raises(ParseError) as err:
        hostlist.expand(expr)
    assert "\n" not in str(err.value) and "hostlist" in str(err.value)


def test_expand_refuses_absurd_sizes_without_building_them() -> None:
    with pytest.raises(ParseError, match="more than 1000000 hosts"):
        hostlist.expand("n[0-99999999999999]")
    with pytest.raises(ParseError, match="more than 1000000 hosts"):
        hostlist.expand("a[0-9999]b[0-9999]")
    with pytest.raises(ParseError, match="more than 10 hosts"):
        hostlist.expand("n[1-11]", max_hosts=10)


@pytest.mark.parametrize(
    ("hosts", "expr"),
    [
        (["n1", "n2"], "n[1-2]"),
        (["gpu001", "gpu002", "gpu003", "gpu004", "gpu010"], "gpu[001-004,010]"),
        (["a", "b1", "b2", "b3", "c"], "a,b[1-3],c"),
        (["node9", "node10"], "node[9-10]"),
        (["node09", "node10"], "node[09-10]"),
        (["n1"], "n1"),
        ([], ""),
        (["n3", "n1", "n2"], "n[3,1-2]"),
    ],
)
def test_compress(hosts: list[str], expr: str) -> None:
    assert hostlist.compress(hosts) == expr
    assert hostlist.expand(expr) == hosts


@pytest.mark.parametrize("bad", ["", "n[1]", "a,b", "a b"])
def test_compress_rejects_names_a_hostlist_cannot_hold(bad: str) -> None:
    with pytest.raises(ParseError):
        hostlist.compress(["n1", bad])


# ---------------------------------------------------------------------------- scontrol show job (text)

# (fixture, job id, expected fields) — times for the files captured here are local times on a UTC host,
# so the table parses them with tz=UTC; one test below checks the local-time default.
SHOW_JOB_TABLE = [
    (
        "22.05-srun-two-nodes.txt",  # real: srun -N2 --ntasks-per-node=1 --gres=gpu:1
        2,
        dict(
            name="python3",
            user="root",
            uid=0,
            account=None,
            partition="debug",
            state="RUNNING",
            submit_time=utc("2026-11-29T18:43:31"),
            start_time=utc("2026-11-29T18:43:34"),
            end_time=None,
            time_limit_s=None,
            nodes=("n1", "n2"),
            cpus=2,
            num_tasks=2,
            memory_bytes=None,
            gpus_by_node={"n1": (1,), "n2": (0,)},
            exit_code=0,
            sluid=None,
            command="python3",
            batch_host="n1",
        ),
    ),
    (
        "22.05-batch-running.txt",  # real: sbatch -J 'train llm' --mem=100 -t 10 -D 'my work dir'
        1,
        dict(
            name="train llm",
            state="RUNNING",
            time_limit_s=600,
            nodes=("n1",),
            cpus=1,
            memory_bytes=100 * MIB,
            gpus_by_node={"n1": (0,)},
            end_time=utc("2026-11-29T18:53:34"),
            work_dir="/tmp/cw-slurm-hhb7x5u6/my work dir",
            command="/tmp/cw-slurm-hhb7x5u6/train.sh --lr 0.1",
        ),
    ),
    (
        "22.05-gpus-uneven.txt",  # real: --gpus=3 over two nodes, two node-detail lines
        5,
        dict(
            nodes=("n1", "n2"),
            gpus_by_node={"n1": (0, 1), "n2": (0,)},
            gpu_count_by_node={"n1": 2, "n2": 1},
            command=None,
        ),
    ),
    (
        "22.05-pending.txt",
        3,
        dict(
            state="PENDING",
            reason="Resources",
            nodes=(),
            start_time=None,
            end_time=None,
            time_limit_s=86400,
            gpus_by_node={},
            memory_bytes=16000 * MIB,
            batch_host=None,
        ),
    ),
    ("22.05-failed.txt", 4, dict(state="FAILED", exit_code=3, exit_signal=0, gpus_by_node={})),
    ("22.05-cancelled.txt", 1, dict(state="CANCELLED", exit_code=0, exit_signal=15)),
    (
        "22.05-oneliner.txt",  # real: scontrol -o show job -d
        5,
        dict(nodes=("n1", "n2"), gpus_by_node={"n1": (0, 1), "n2": (0,)}, work_dir="/tmp/cw-slurm-hhb7x5u6"),
    ),
    (
        "19.05-gres-idx.txt",  # GRES_IDX=gpu(IDX:0-1): no count before 20.02
        4711,
        dict(
            user="alice",
            uid=1000,
            account="nlp",
            nodes=("node-63", "node-64"),
            gpus_by_node={"node-63": (0, 1), "node-64": (2, 3)},
            gpu_count_by_node={"node-63": 2, "node-64": 2},
            memory_bytes=4000 * MIB,
            time_limit_s=86400,
        ),
    ),
    (
        "23.11-typed-gpus.txt",
        90210,
        dict(
            name="llama finetune",
            nodes=("gpu001", "gpu002", "gpu010"),
            gpus_by_node={"gpu001": (0, 1, 2, 3), "gpu002": (0, 1, 2, 3), "gpu010": (1, 3)},
            time_limit_s=2 * 86400 + 12 * 3600,
            memory_bytes=3 * 256000 * MIB,
            cpus=96,
            num_tasks=12,
            command="/home/bob/ft.sh --config conf/a=b.yaml",
            work_dir="/home/bob/runs/llama ft",
        ),
    ),
    (
        "23.11-typed-gpus.txt",  # gpu(CNT:2): a count without indexes
        90211,
        dict(
            gpus_by_node={"gpu011": ()},
            gpu_count_by_node={"gpu011": 2},
            time_limit_s=1800,
            memory_bytes=16384 * MIB,
        ),
    ),
    (
        "26.05-sluid-shard.txt",
        1234567,
        dict(
            sluid="s5K1KKYAYG5D00",
            state="COMPLETED",
            time_limit_s=None,
            nodes=("rack0_blade0", "rack0_blade1", "rack1_blade0", "rack1_blade1"),
            gpus_by_node={
                "rack0_blade0": (0,),
                "rack0_blade1": (0,),
                "rack1_blade0": (7,),
                "rack1_blade1": (7,),
            },
            end_time=utc("2026-11-29T18:36:46"),
        ),
    ),
    (
        "23.02-v0.0.39.json",  # job_state a string, NO_VAL structs
        512,
        dict(
            name="bert large",
            user="alice",
            uid=1000,
            state="RUNNING",
            nodes=("gpu01", "gpu02"),
            gpus_by_node={"gpu01": (0, 1), "gpu02": (2, 3)},
            time_limit_s=86400,
            start_time=1700000000,
            memory_bytes=2 * 64000 * MIB,
            work_dir="/home/alice/run 1",
            cpus=16,
            num_tasks=4,
        ),
    ),
    (
        "23.02-v0.0.39.json",
        513,
        dict(
            state="PENDING",
            nodes=(),
            start_time=None,
            end_time=None,
            time_limit_s=None,
            account=None,
            command=None,
            exit_code=3,
            reason="Resources",
        ),
    ),
    (
        "24.05-v0.0.41.json",  # job_state a list of flags, exit_code an object
        77,
        dict(
            state="COMPLETING",  # ["CANCELLED", "COMPLETING"]: as squeue shows it, until the flag clears
            nodes=("n1", "n2"),
            gpus_by_node={"n1": (0,), "n2": ()},
            gpu_count_by_node={"n1": 1, "n2": 1},
            exit_code=0,
            exit_signal=9,
            time_limit_s=3600,
            memory_bytes=4 * 1024 * MIB,
        ),
    ),
]


@pytest.mark.parametrize(("fixture", "job_id", "expected"), SHOW_JOB_TABLE)
def test_show_job(fixture: str, job_id: int, expected: dict) -> None:
    records = {r.job_id: r for r in parse_show_job((FIXTURES / fixture).read_text(), tz=UTC)}
    record = records[job_id]
    got = {key: getattr(record, key) for key in expected}
    assert got == expected


def test_show_job_all_jobs_in_one_output() -> None:
    records = parse_show_job((FIXTURES / "22.05-all.txt").read_text(), tz=UTC)
    assert [(r.job_id, r.state) for r in records] == [
        (1, "CANCELLED"),
        (2, "CANCELLED"),
        (3, "CANCELLED"),
        (4, "FAILED"),
        (5, "RUNNING"),
    ]


def test_text_times_default_to_the_local_timezone() -> None:
    [record] = parse_show_job((FIXTURES / "22.05-srun-two-nodes.txt").read_text())
    assert record.start_time == int(datetime(2026, 11, 29, 18, 43, 34).timestamp())


@pytest.mark.parametrize("text", ["", "No jobs in the system\n"])
def test_show_job_empty(text: str) -> None:
    assert parse_show_job(text) == []


@pytest.mark.parametrize(
    "text",
    [
        "hello world",
        "JobName=x\n   JobState=RUNNING",  # no JobId
        "JobId=abc JobState=RUNNING",
        "JobId=1 JobState=RUNNING SubmitTime=yesterday",
        "JobId=1 JobState=RUNNING NodeList=n[1-",
        "JobId=1 JobState=RUNNING TimeLimit=forever",
        "JobId=1 JobState=RUNNING\n   Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:x)",
        '{"jobs": 3}',
        '{"jobs": [{"job_id": 1, "job_state": 5}]}',
        '{"jobs": [{"job_id": {"set": true, "infinite": false, "number": "1"}}]}',
        '{"errors": [{"description": "Invalid job id specified"}]}',
        "{not json",
    ],
)
def test_show_job_garbage_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        parse_show_job(text)


@pytest.mark.parametrize(
    ("text", "indexes", "count"),
    [
        ("gpu:2(IDX:0-1)", (0, 1), 2),
        ("gpu:a100:1(IDX:3)", (3,), 1),
        ("gpu(IDX:0-1)", (0, 1), 2),
        ("gpu(CNT:2)", (), 2),
        ("gpu:a100:3(IDX:0-1,3),shard:2(IDX:0)", (0, 1, 3), 3),
        ("shard:4(IDX:0-1)", (), 0),
        ("gpu:1(IDX:N/A)", (), 1),
        ("", (), 0),
    ],
)
def test_gres_detail(text: str, indexes: tuple[int, ...], count: int) -> None:
    assert parse_gres_detail(text) == (indexes, count)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("UNLIMITED", None),
        ("Partition_Limit", None),
        ("30", 1800),
        ("10:00", 600),
        ("01:00:00", 3600),
        ("1-00:00:00", 86400),
        ("2-12", 2 * 86400 + 12 * 3600),
        ("1-02:03", 86400 + 2 * 3600 + 180),
    ],
)
def test_duration(text: str, seconds: int | None) -> None:
    assert parse_duration(text) == seconds


# ------------------------------------------------------------------------------------------- listpids

LISTPIDS_TABLE = [
    (
        "22.05-listpids-batch.txt",  # real: sbatch script with a background child and an srun step
        [
            PidEntry(7991, 1, "0", 0, 0),
            PidEntry(7969, 1, "batch", 0, 0),
            PidEntry(7974, 1, "batch", None, None),
            PidEntry(7970, 1, "batch", None, None),
            PidEntry(7971, 1, "batch", None, None),
        ],
    ),
    ("22.05-listpids-n2.txt", [PidEntry(8020, 2, "0", 0, 1)]),
    # real: right after srun, a task slurmstepd has not forked yet is printed with PID -1 (the extern
    # row is this file's only addition, to show that the rest of the output is kept).
    ("22.05-listpids-starting.txt", [PidEntry(7367, 1, "extern", None, None)]),
    ("24.11-listpids.json", [PidEntry(31337, 42, "0", 0, 1), PidEntry(31340, 42, "extern", None, None)]),
]


@pytest.mark.parametrize(("fixture", "entries"), LISTPIDS_TABLE)
def test_listpids(fixture: str, entries: list[PidEntry]) -> None:
    assert parse_listpids((FIXTURES / fixture).read_text()) == entries


@pytest.mark.parametrize(
    "text",
    [
        "There are no steps for job 9999 on node (null).",
        "PID JOBID STEPID LOCALID GLOBALID\n12 x 0 0 0",
        "PID JOBID STEPID LOCALID GLOBALID\n12 1 0 0",
        '{"pids": [{"pid": 1}]}',
        '{"pids": [{"pid": 1, "job_id": 2, "step_id": "0", "local_task_id": "x"}]}',
        "[]",
    ],
)
def test_listpids_garbage(text: str) -> None:
    with pytest.raises(ParseError):
        parse_listpids(text)


def test_listpids_empty_output_is_no_processes() -> None:
    assert parse_listpids("") == []


# ------------------------------------------------------------------------------------- /proc cgroup

CGROUP_TABLE = [
    ("0::/system.slice/slurmstepd.scope/job_123/step_0/user/task_0\n", CgroupJob(123, None, "0", 0)),
    ("0::/system.slice/slurmstepd.scope/job_123/step_batch/slurm\n", CgroupJob(123, None, "batch", None)),
    (
        "0::/system.slice/slurmstepd.scope/job_5/step_extern/user/task_special\n",
        CgroupJob(5, None, "extern", None),
    ),
    (
        "0::/system.slice/n2_slurmstepd.scope/job_9/step_1/user/task_3\n",
        CgroupJob(9, None, "1", 3, node="n2"),
    ),
    (
        "0::/system.slice/slurmstepd.scope/s5K1KKYAYG5D00/step_0/user/task_1\n",
        CgroupJob(None, "s5K1KKYAYG5D00", "0", 1),
    ),
    ("0::/system.slice/slurmstepd.scope/job_77\n", CgroupJob(77, None, None, None)),
    (
        "12:pids:/slurm/uid_1000/job_123/step_0/task_2\n11:memory:/slurm/uid_1000/job_123/step_0/task_2\n"
        "1:name=systemd:/user.slice/user-1000.slice\n",
        CgroupJob(123, None, "0", 2, uid=1000),
    ),
    (
        "4:memory:/slurm_n1/uid_0/job_8/step_batch\n0::/\n",
        CgroupJob(8, None, "batch", None, uid=0, node="n1"),
    ),
    ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
    ("0::/\n", None),
    ("", None),
]


@pytest.mark.parametrize(("text", "expected"), CGROUP_TABLE)
def test_cgroup(text: str, expected: CgroupJob | None) -> None:
    assert parse_cgroup(text) == expected


@pytest.mark.parametrize("text", ["garbage", "x::/a", "0:/system.slice"])
def test_cgroup_garbage(text: str) -> None:
    with pytest.raises(ParseError):
        parse_cgroup(text)


# ------------------------------------------------------------------------------------ /proc environ


def test_environ_and_labels() -> None:
    data = (
        b"PATH=/usr/bin\0SLURM_JOB_ID=42\0SLURM_STEP_ID=0\0SLURM_PROCID=3\0SLURM_LOCALID=1\0RANK=3\0"
        b"LOCAL_RANK=1\0WORLD_SIZE=8\0SLURM_JOB_GPUS=2,3\0CUDA_VISIBLE_DEVICES=0,1\0EQ=a=b\0noequals\0"
        b"BIN=\xff\xfe\0"
    )
    env = parse_environ(data)
    assert env["EQ"] == "a=b" and "noequals" not in env and env["BIN"] == "\ufffd\ufffd"
    assert environ_labels(env) == EnvLabels(
        job_id=42,
        step_id="0",
        proc_id=3,
        local_id=1,
        rank=3,
        local_rank=1,
        world_size=8,
        job_gpus="2,3",
        cuda_visible_devices="0,1",
    )


def test_environ_labels_absent_or_malformed_are_none() -> None:
    assert environ_labels(parse_environ(b"SLURM_JOB_ID=abc\0RANK=-1\0")) == EnvLabels()
    assert environ_labels({"SLURM_JOBID": "7"}).job_id == 7
    assert parse_environ(b"") == {}
    with pytest.raises(ParseError):
        parse_environ("text, not bytes")  # type: ignore[arg-type]
