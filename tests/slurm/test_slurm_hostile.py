"""Hostile job names: a value scontrol prints raw never makes, changes or hides another job's record.

Slurm prints job names (and comments, paths) raw in ``scontrol show job -d``: newlines, carriage returns, a
blank line and a made-up ``JobId=`` record are all accepted. These tests read listings with such names
through the pure parser (tables and a hypothesis property), through the real ScontrolMapper running a
scontrol and squeue that print given texts, and on the real two-node Slurm, where an unprivileged user
submits the jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from datetime import timezone
from pathlib import Path

import pytest
from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.jobmap.registry import JobRegistry
from clusterwatch.collector.jobmap.scontrol import ScontrolMapper
from clusterwatch.collector.state.core import CollectorCore
from clusterwatch.collector.state.store import Store, open_db
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from clusterwatch.errors import ParseError
from clusterwatch.model import JobEvent
from clusterwatch.slurm.scontrol import (
    JobRecord,
    Owner,
    parse_show_job,
    read_one_job_text,
    read_show_job_text,
)
from tests.services.slurm import SlurmCluster, running_slurm_cluster
from tests.support.helpers import TESTS

UTC = timezone.utc
FIXTURES = TESTS / "fixtures" / "scontrol"
NOBODY = (65534, "nobody")
USERA = (1001, "usera")


def record_text(job_id: int, name: str, owner: Owner, state: str = "RUNNING", node: str = "n1",
                comment: str | None = None) -> str:
    """One record as Slurm 22.05's ``scontrol show job -d`` prints it (slurm_sprint_job_info's layout)."""
    uid, user = owner
    lines = [
        f"JobId={job_id} JobName={name}",
        f"   UserId={user}({uid}) GroupId={user}({uid}) MCS_label=N/A",
        "   Priority=4294901758 Nice=0 Account=(null) QOS=(null)",
        f"   JobState={state} Reason=None Dependency=(null)",
        "   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0",
        "   DerivedExitCode=0:0",
        "   RunTime=00:00:05 TimeLimit=UNLIMITED TimeMin=N/A",
        "   SubmitTime=2026-12-01T12:24:20 EligibleTime=2026-12-01T12:24:20",
        "   AccrueTime=2026-12-01T12:24:20",
        "   StartTime=2026-12-01T12:24:21 EndTime=Unknown Deadline=N/A",
        "   SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-01T12:24:21 Scheduler=Main",
        "   Partition=debug AllocNode:Sid=localhost:3633",
        "   ReqNodeList=(null) ExcNodeList=(null)",
        f"   NodeList={node}",
        f"   BatchHost={node}",
        "   NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:*",
        "   TRES=cpu=1,mem=8000M,node=1,billing=1",
        "   Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=*",
        "   JOB_GRES=gpu:1",
        f"     Nodes={node} CPU_IDs=0 Mem=8000 GRES=gpu:1(IDX:0)",
        "   MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0",
        "   Features=(null) DelayBoot=00:00:00",
        "   OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null)",
        "   Command=(null)",
        "   WorkDir=/tmp",
        *([f"   Comment={comment}"] if comment is not None else []),
        "   StdErr=/dev/null",
        "   StdIn=/dev/null",
        "   StdOut=/dev/null",
        "   Power=",
        "   ",
        "",
        "",
    ]
    return "\n".join(lines)


def forged_record(job_id: int, owner: Owner, state: str = "RUNNING") -> str:
    """What a hostile name holds: a blank line, then a whole record of another job, ending in a name."""
    return "\n\n" + record_text(job_id, "forged", owner, state=state).rstrip("\n ") + "\n   \n\n"


def resolve(listing: str, alone: Mapping[int, str], owners: Mapping[int, Owner] | None) -> dict[int, JobRecord]:
    """What ScontrolMapper does with a listing: the records read, plus those asked for one by one."""
    read = read_show_job_text(listing, tz=UTC, owners=owners)
    records = {r.job_id: r for r in read.records}
    for job_id in read.recheck:
        assert job_id not in records
        text = alone.get(job_id)
        if text is None:
            continue  # scontrol: Invalid job id specified
        single = read_show_job_text(text, tz=UTC, owners=None if owners is None else {job_id: owners[job_id]})
        found = [r for r in single.records if r.job_id == job_id]
        if found:
            records[job_id] = found[0]
            continue
        with contextlib.suppress(ParseError):
            one = read_one_job_text(text, job_id, tz=UTC, owner=None if owners is None else owners[job_id])
            if one is not None:
                records[job_id] = one
    return records


def hostile_names(victim: int) -> list[str]:
    return [
        # The steal of issue 13: the old parser read a job 8 of nobody's out of this name.
        f"x JobState=RUNNING\n\nJobId={victim} JobName=stolen\n   UserId=nobody(65534) GroupId=nogroup(65534) "
        f"MCS_label=N/A\n   JobState=RUNNING Reason=None Dependency=(null)\n\nJobId={victim + 50} JobName=rest",
        f"x JobState=RUNNING\n\nJobId={victim} JobName=stolen\n   UserId=usera(1001) GroupId=usera(1001) "
        "MCS_label=N/A\n   JobState=RUNNING Reason=None Dependency=(null)\n\nnot key value",
        "a" + forged_record(victim, NOBODY, state="COMPLETED") + f"JobId={victim + 60} JobName=b",
        "y\n\nnot key value",
        "z\n   UserId=root(0) GroupId=root(0) MCS_label=N/A",
        "w UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=1 JobState=COMPLETED",
        "JobState=COMPLETED",
        "cr\r\nUserId=root(0)\rJobState=FAILED\x1c\u2028\x85",
        "a" + forged_record(victim, USERA, state="COMPLETED") + "b",
        "a" + forged_record(victim + 100, USERA) + "b",
        "a" + forged_record(victim + 100, NOBODY),
        "\n   \n\n",
        "\nJobId=1 JobName=",
        "",
    ]


VICTIM = 8
HOSTILE = 7


def _listing(name: str, hostile_first: bool) -> tuple[str, dict[int, str]]:
    hostile = record_text(HOSTILE, name, NOBODY, state="PENDING")
    victim = record_text(VICTIM, "plain", USERA)
    text = hostile + victim if hostile_first else victim + hostile
    return text, {HOSTILE: hostile, VICTIM: victim}


OWNERS = {HOSTILE: NOBODY, VICTIM: USERA}


def _assert_both_true(records: Mapping[int, JobRecord], name: str) -> None:
    assert set(records) == {HOSTILE, VICTIM}
    assert (records[HOSTILE].uid, records[HOSTILE].user) == NOBODY
    assert records[HOSTILE].name == name and records[HOSTILE].state == "PENDING"
    assert (records[VICTIM].uid, records[VICTIM].user) == USERA
    assert records[VICTIM].name == "plain" and records[VICTIM].state == "RUNNING"
    assert records[VICTIM].nodes == ("n1",) and records[VICTIM].gpus_by_node == {"n1": (0,)}


@pytest.mark.parametrize("hostile_first", [True, False])
@pytest.mark.parametrize("name", hostile_names(VICTIM))
def test_a_hostile_name_gives_both_jobs_their_true_ids_and_owners(name: str, hostile_first: bool) -> None:
    listing, alone = _listing(name, hostile_first)
    _assert_both_true(resolve(listing, alone, OWNERS), name)


@pytest.mark.parametrize(
    "name",
    ["y\n\nnot key value", "z\n   UserId=root(0) GroupId=root(0) MCS_label=N/A", "JobState=COMPLETED",
     "cr\r\nUserId=root(0)\rJobState=FAILED\x1c\u2028\x85", "q\n\n   JobState=COMPLETED\n   NodeList=n2"],
)
def test_names_that_forge_no_record_start_read_right_without_the_owners_list(name: str) -> None:
    listing, _ = _listing(name, hostile_first=True)
    read = read_show_job_text(listing, tz=UTC)
    assert read.recheck == () and read.skipped == 0
    _assert_both_true({r.job_id: r for r in read.records}, name)


def test_the_victim_is_never_given_away_even_without_the_owners_list() -> None:
    # Without squeue's list a forged start naming the victim appears twice: both are asked for alone.
    name = "x" + forged_record(VICTIM, NOBODY, state="COMPLETED")
    listing, alone = _listing(name, hostile_first=True)
    read = read_show_job_text(listing, tz=UTC)
    assert VICTIM in read.recheck and all(r.job_id != VICTIM for r in read.records)
    _assert_both_true(resolve(listing, alone, None), name)


def test_the_captured_listing_of_a_hostile_name() -> None:
    # The shape scontrol 22.05 printed on the test cluster (2026-12-01) for nobody's job 7 named
    # "x JobState=RUNNING\n\nJobId=8 JobName=stolen\n   UserId=nobody(65534)...\n\nnot key value" beside
    # root's job 8; the old parser gave job 8 to nobody, or failed the whole listing.
    text = (FIXTURES / "22.05-hostile-names.txt").read_text()
    owners = {7: NOBODY, 8: (0, "root")}
    read = read_show_job_text(text, tz=UTC, owners=owners)
    assert read.records == [] and set(read.recheck) == {7, 8}
    blocks = text.split("\n\nJobId=8 JobName=plain")
    alone = {7: blocks[0] + "\n\n", 8: "JobId=8 JobName=plain" + blocks[1]}
    records = resolve(text, alone, owners)
    assert (records[7].uid, records[7].user, records[7].state) == (65534, "nobody", "PENDING")
    assert records[7].name.startswith("x JobState=RUNNING\n\nJobId=8 JobName=stolen\n")
    assert (records[8].uid, records[8].user, records[8].state, records[8].nodes) == (0, "root", "RUNNING", ("n1",))
    assert [r.uid for r in parse_show_job(text, tz=UTC) if r.job_id == 8] == []  # never nobody's


@pytest.mark.parametrize(
    "comment",
    [f"c\n\nJobId={VICTIM} JobName=x\n   UserId=nobody(65534) GroupId=nogroup(65534) MCS_label=N/A\n"
     "   JobState=COMPLETED Reason=None Dependency=(null)",
     "c\n   UserId=root(0) GroupId=root(0) MCS_label=N/A",
     "c" + forged_record(VICTIM + 5, USERA)],
)
def test_a_hostile_comment_never_changes_another_job(comment: str) -> None:
    hostile = record_text(HOSTILE, "h", NOBODY, state="PENDING", comment=comment)
    victim = record_text(VICTIM, "plain", USERA)
    for listing in (hostile + victim, victim + hostile):
        records = resolve(listing, {HOSTILE: hostile, VICTIM: victim}, OWNERS)
        assert (records[VICTIM].uid, records[VICTIM].user, records[VICTIM].state) == (1001, "usera", "RUNNING")
        assert set(records) <= {HOSTILE, VICTIM}
        if HOSTILE in records:  # or left out: its own text does not read
            assert (records[HOSTILE].uid, records[HOSTILE].user) == NOBODY


def test_a_record_that_does_not_read_is_skipped_not_the_listing() -> None:
    bad = record_text(5, "b", NOBODY).replace("   TimeLimit=UNLIMITED", "   TimeLimit=forever")
    bad = bad.replace("RunTime=00:00:05 TimeLimit=UNLIMITED", "RunTime=00:00:05 TimeLimit=forever")
    text = bad + record_text(VICTIM, "plain", USERA)
    read = read_show_job_text(text, tz=UTC, owners={5: NOBODY, VICTIM: USERA})
    assert [r.job_id for r in read.records] == [VICTIM] and read.recheck == (5,)
    with pytest.raises(ParseError, match="forever"):
        read_one_job_text(bad, 5, tz=UTC, owner=NOBODY)


def test_a_record_squeue_does_not_know_is_skipped_and_counted() -> None:
    text = record_text(HOSTILE, "h", NOBODY) + record_text(VICTIM, "plain", USERA)
    read = read_show_job_text(text, tz=UTC, owners={VICTIM: USERA})
    assert [r.job_id for r in read.records] == [VICTIM] and read.skipped == 1 and read.recheck == ()


def test_an_owner_squeue_does_not_confirm_is_asked_again_and_refused() -> None:
    text = record_text(VICTIM, "plain", NOBODY)
    read = read_show_job_text(text, tz=UTC, owners={VICTIM: USERA})
    assert read.records == [] and read.recheck == (VICTIM,)
    with pytest.raises(ParseError, match="not the owner squeue reports"):
        read_one_job_text(text, VICTIM, tz=UTC, owner=USERA)


# Names as Slurm could hold them: any text without NUL, with the pieces of its own layout mixed in.
_PIECES = st.sampled_from([
    "\n", "\r", "\n\n", "\n   ", "\n   \n\n", "JobId=8 ", "JobId=9 JobName=", "\nJobId=8 JobName=f",
    "\n   UserId=root(0) GroupId=root(0) MCS_label=N/A", "\n   UserId=usera(1001) GroupId=usera(1001) MCS_label=N/A",
    " UserId=root(0)", "\n   JobState=COMPLETED Reason=None Dependency=(null)", "\n     Nodes=n2 CPU_IDs=0 Mem=0 GRES=",
    "\n   NodeList=n2", "JobState=", "=", " ", "\t", "\x1c", "\u2028", forged_record(8, NOBODY),
    forged_record(9, USERA), forged_record(8, USERA, state="COMPLETED"),
])
_NAMES = st.lists(st.one_of(_PIECES, st.text(st.characters(blacklist_characters="\x00"), max_size=8)),
                  max_size=12).map("".join)


@settings(max_examples=400, deadline=None)
@given(name=_NAMES, hostile_first=st.booleans())
def test_for_any_name_both_jobs_keep_their_true_id_and_owner(name: str, hostile_first: bool) -> None:
    listing, alone = _listing(name, hostile_first)
    _assert_both_true(resolve(listing, alone, OWNERS), name)


@settings(max_examples=300, deadline=None)
@given(name=_NAMES)
def test_for_any_name_the_other_job_is_never_given_to_its_author(name: str) -> None:
    # Without squeue's list the hostile job itself may be left out, but no record names the victim's
    # id with its author as owner, and the victim is never lost.
    listing, alone = _listing(name, hostile_first=True)
    records = resolve(listing, alone, None)
    assert (records[VICTIM].uid, records[VICTIM].user, records[VICTIM].state) == (1001, "usera", "RUNNING")


# ------------------------------------------------------------- the real ScontrolMapper, given texts


def _fake_slurm(folder: Path, listing: str, alone: Mapping[int, str], owners: Mapping[int, Owner],
                squeue_json: str | None = None) -> str:
    """A scontrol and a squeue that print the given texts (as bytes, with no newline translation).

    With ``squeue_json``, that squeue's --help lists --json, and --json prints it ("FAIL": exits 1 the way
    a squeue without its JSON plugin does).
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "squeue.json").write_bytes((squeue_json or "").encode())
    help_json = "echo '  --json'" if squeue_json else ":"
    (folder / "listing.txt").write_bytes(listing.encode())
    for job_id, text in alone.items():
        (folder / f"job-{job_id}.txt").write_bytes(text.encode())
    (folder / "owners.txt").write_text("".join(f"{j} {u} {n}\n" for j, (u, n) in owners.items()))
    (folder / "scontrol").write_text(
        "#!/bin/sh\n"
        f'cd "{folder}"\n'
        'case "$*" in\n'
        '  "show job -d") exec cat listing.txt ;;\n'
        '  "show job -d "*) [ -f "job-$4.txt" ] && exec cat "job-$4.txt"\n'
        '     echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1 ;;\n'
        'esac\nexit 2\n'
    )
    (folder / "squeue").write_text(
        "#!/bin/sh\n"
        f'cd "{folder}"\n'
        'for last; do :; done\n'
        'case "$*" in\n'
        f'  "--help") echo "Usage: squeue [OPTIONS]"; {help_json}; exit 0 ;;\n'
        '  "--json") grep -q "^FAIL$" squeue.json && {\n'
        '     echo "squeue: error: serializer/json: plugin not found" >&2; exit 1; }\n'
        '     exec cat squeue.json ;;\n'
        '  *" -j "*) grep "^$last " owners.txt && exit 0\n'
        '     echo "squeue: error: Invalid job id specified" >&2; exit 1 ;;\n'
        '  *) exec cat owners.txt ;;\n'
        'esac\n'
    )
    for binary in ("scontrol", "squeue"):
        (folder / binary).chmod(0o755)
    return str(folder / "scontrol")


@pytest.mark.parametrize("name", hostile_names(VICTIM))
@pytest.mark.parametrize("hostile_first", [True, False])
def test_the_mapper_gives_both_jobs_their_true_owner(tmp_path: Path, name: str, hostile_first: bool) -> None:
    listing, alone = _listing(name, hostile_first)
    scontrol = _fake_slurm(tmp_path, listing, alone, OWNERS)
    mapper = ScontrolMapper(scontrol=scontrol, use_json=False, retries=0)

    async def main() -> tuple[list[JobRecord], JobRecord | None, JobRecord | None]:
        return await mapper.list_jobs(), await mapper.show_job(HOSTILE), await mapper.show_job(VICTIM)

    running, hostile, victim = asyncio.run(main())
    assert [(r.job_id, r.uid, r.user) for r in running] == [(VICTIM, 1001, "usera")]
    assert hostile is not None and (hostile.uid, hostile.user, hostile.name) == (65534, "nobody", name)
    assert victim is not None and (victim.uid, victim.user, victim.state) == (1001, "usera", "RUNNING")
    assert mapper.reachability.reachable is True


def _json_job(job_id: int, name: str, owner: Owner, state: str = "RUNNING") -> dict:
    return {"job_id": job_id, "name": name, "user_id": owner[0], "user_name": owner[1], "job_state": state,
            "nodes": "n1", "gres_detail": ["gpu:1(IDX:0)"], "cpus": 1, "tasks": 1, "exit_code": 0,
            "time_limit": None, "submit_time": 1796127860, "start_time": 1796127861, "end_time": 0}


@pytest.mark.parametrize("name", hostile_names(VICTIM))
def test_where_squeue_has_json_listings_come_from_it(tmp_path: Path, name: str) -> None:
    # Slurm 21.08-22.05: scontrol has no --json, squeue does; it escapes every value.
    listing, alone = _listing(name, hostile_first=True)
    doc = json.dumps({"jobs": [_json_job(HOSTILE, name, NOBODY), _json_job(VICTIM, "plain", USERA)]})
    scontrol = _fake_slurm(tmp_path, listing, alone, OWNERS, squeue_json=doc)
    mapper = ScontrolMapper(scontrol=scontrol, retries=0)
    running = asyncio.run(mapper.list_jobs())
    assert mapper.source == "squeue --json"
    assert sorted((r.job_id, r.uid, r.user, r.name) for r in running) == [
        (HOSTILE, 65534, "nobody", name), (VICTIM, 1001, "usera", "plain")]
    hostile = asyncio.run(mapper.show_job(HOSTILE))  # one job: scontrol's text, read against squeue's owner
    assert hostile is not None and (hostile.uid, hostile.name) == (65534, name)
    assert mapper.records_skipped == 0


def test_a_squeue_whose_json_does_not_work_falls_back_to_the_text(tmp_path: Path, caplog) -> None:
    listing, alone = _listing("n\n\nJobId=8 JobName=x", hostile_first=True)
    scontrol = _fake_slurm(tmp_path, listing, alone, OWNERS, squeue_json="FAIL")
    mapper = ScontrolMapper(scontrol=scontrol, retries=0)
    for _ in range(2):
        running = asyncio.run(mapper.list_jobs())  # the hostile job is PENDING: not listed as active
        assert [(r.job_id, r.uid) for r in running] == [(VICTIM, 1001)]
    assert mapper.source == "text" and mapper.records_skipped == 0
    said = [r.getMessage() for r in caplog.records if "squeue --json did not work" in r.getMessage()]
    assert len(said) == 1 and "plugin not found" in said[0]


def test_json_with_no_job_at_all_is_an_empty_listing() -> None:
    assert parse_show_job("{\n}") == [] and parse_show_job("{}\n") == []


def test_records_asked_alone_are_bounded_per_listing_and_the_rest_counted(tmp_path: Path) -> None:
    # One name forges the starts of two other jobs: three records to ask alone, one allowed.
    name = "x\n\nJobId=8 JobName=a\n\nJobId=9 JobName=b"
    texts = {7: record_text(7, name, NOBODY), 8: record_text(8, "p", USERA), 9: record_text(9, "q", USERA)}
    owners = {7: NOBODY, 8: USERA, 9: USERA}
    scontrol = _fake_slurm(tmp_path, "".join(texts.values()), texts, owners)
    mapper = ScontrolMapper(scontrol=scontrol, use_json=False, retries=0, recheck_limit=1)
    assert [r.job_id for r in asyncio.run(mapper.list_jobs())] == [7]
    assert mapper.records_skipped == 2
    mapper = ScontrolMapper(scontrol=scontrol, use_json=False, retries=0)
    assert sorted((r.job_id, r.uid) for r in asyncio.run(mapper.list_jobs())) == [(7, 65534), (8, 1001), (9, 1001)]
    assert mapper.records_skipped == 0


def test_the_registry_counts_what_it_left_out_and_keeps_the_others(tmp_path: Path) -> None:
    bad = record_text(5, "b\n   NodeList=n2 x=1", NOBODY, comment="c\nJobState=COMPLETED")
    listing = bad + record_text(VICTIM, "plain", USERA)
    scontrol = _fake_slurm(tmp_path, listing, {5: bad, VICTIM: record_text(VICTIM, "plain", USERA)},
                           {5: NOBODY, VICTIM: USERA})
    core = CollectorCore(CollectorConfig(), Store(open_db(":memory:")))
    core.state.job_event("n1", JobEvent("start", str(VICTIM), 1.0))
    registry = JobRegistry(core, ScontrolMapper(scontrol=scontrol, use_json=False, retries=0))
    assert asyncio.run(registry.refresh()) is True
    job = core.state.jobs[str(VICTIM)]
    assert (job.user, job.state, job.note) == ("usera", "RUNNING", "")
    assert "5" not in core.state.jobs
    assert registry.records_skipped == 1  # job 5: its comment's newline leaves a line that is not Slurm's


# ------------------------------------------------------------------- the real two-node Slurm


@pytest.fixture(scope="module")
def open_cluster() -> Iterator[SlurmCluster]:
    """A cluster of our own whose folder, config and munge socket an unprivileged user can reach."""
    with tempfile.TemporaryDirectory(prefix="cw-hostile-", dir="/tmp") as folder:
        root = Path(folder)
        root.chmod(0o711)
        with running_slurm_cluster(root) as cluster:
            (root / "munge").chmod(0o711)  # munged created it 0700; its socket is for everyone
            yield cluster


@pytest.fixture
def cluster(open_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """`open_cluster`, with every job a test left there cancelled after it (a failed test leaves its jobs on the
    nodes' two CPUs, and the next test's would wait behind them)."""
    yield open_cluster
    listed = open_cluster.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split()
    if listed:
        open_cluster.run(["scancel", *listed], check=False)


def _sbatch(cluster: SlurmCluster, name: str, as_nobody: bool) -> int:
    args = ["sbatch", "--parsable", "--chdir=/tmp", "-o", "/dev/null", "--mem=10M", "-J", name,
            "--wrap", "sleep 120"]
    if as_nobody:
        args = ["runuser", "-u", "nobody", "--", *args]
    # Bytes, not text: subprocess's text mode would turn the \r\n of a name into \n on the way back.
    out = subprocess.run(args, env=cluster.env, cwd="/tmp", capture_output=True, timeout=30)
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    return int(out.stdout.decode().strip().split(";")[0])


@pytest.mark.slurm
@pytest.mark.parametrize("use_json", [False, None], ids=["text", "auto"])
def test_on_real_slurm_hostile_names_of_an_unprivileged_user_steal_nothing(
    cluster: SlurmCluster, use_json: bool | None
) -> None:
    victim = _sbatch(cluster, "victim", as_nobody=False)  # root's job, the one to steal
    cluster.wait_job_state(victim, ["RUNNING"])
    forged = (f"\n\nJobId={victim} JobName=stolen\n   UserId=nobody(65534) GroupId=nogroup(65534) "
              "MCS_label=N/A\n   JobState=COMPLETED Reason=None Dependency=(null)\n   NodeList=n2")
    names = [
        f"x JobState=RUNNING{forged}\n\nJobId={victim + 50} JobName=rest",
        f"y{forged}\n\nnot key value",
        "z\n   UserId=root(0) GroupId=root(0) MCS_label=N/A\r\n   JobState=COMPLETED",
        f"w\n\n\nJobId={victim} JobName=\x1c\u2028",
    ]
    hostile = {_sbatch(cluster, name, as_nobody=True): name for name in names}
    # A name changed after submission, by its owner: scontrol update prints it the same way.
    renamed = _sbatch(cluster, "plain", as_nobody=True)
    new_name = f"r{forged}"
    update = subprocess.run(["runuser", "-u", "nobody", "--", "scontrol", "update", f"JobId={renamed}",
                             f"JobName={new_name}"], env=cluster.env, capture_output=True, timeout=30)
    assert update.returncode == 0, update.stderr.decode(errors="replace")
    hostile[renamed] = new_name

    mapper = ScontrolMapper(env=cluster.env, retries=0, use_json=use_json)
    core = CollectorCore(CollectorConfig(), Store(open_db(":memory:")))
    for job_id in [victim, *hostile]:
        core.state.job_event("n1", JobEvent("start", str(job_id), 1.0))
    registry = JobRegistry(core, mapper)

    async def main() -> tuple[bool, list[JobRecord], dict[int, JobRecord | None]]:
        answered = await registry.refresh()
        return answered, await mapper.list_jobs(), {j: await mapper.show_job(j) for j in [victim, *hostile]}

    answered, running, shown = asyncio.run(main())
    assert answered is True
    by_id = {r.job_id: r for r in running}
    assert (by_id[victim].uid, by_id[victim].user, by_id[victim].name) == (0, "root", "victim")
    assert by_id[victim].state == "RUNNING" and by_id[victim].nodes
    assert all(r.job_id in {victim, *hostile} for r in running)  # no job made up from a name
    assert all((r.uid, r.user) == (65534, "nobody") for r in running if r.job_id != victim)
    for job_id, name in hostile.items():
        record = shown[job_id]
        assert record is not None, job_id
        assert (record.uid, record.user, record.name) == (65534, "nobody", name)
    assert shown[victim] is not None and (shown[victim].uid, shown[victim].state) == (0, "RUNNING")
    # The registry gives every job to its true owner and keeps the victim running, with Slurm answering.
    assert core.state.jobs[str(victim)].user == "root" and core.state.jobs[str(victim)].state == "RUNNING"
    for job_id, name in hostile.items():
        assert (core.state.jobs[str(job_id)].user, core.state.jobs[str(job_id)].name) == ("nobody", name)
    assert all(not job.note for job in core.state.jobs.values())
    assert set(core.state.jobs) == {str(j) for j in [victim, *hostile]}
    if use_json is False:
        # Each of the two listings (the registry's pass, list_jobs) left out one made-up record: the JobId=
        # victim+50 of the first name, unknown to squeue. The forged copies of the victim were asked alone.
        assert registry.records_skipped == mapper.records_skipped == 2
    else:
        # Slurm 22.05 here: scontrol has no --json, squeue has; its listing escapes every value.
        helped = subprocess.run(["squeue", "--help"], env=cluster.env, capture_output=True, text=True, timeout=30)
        assert mapper.source == ("squeue --json" if "--json" in helped.stdout + helped.stderr else "text")
        assert registry.records_skipped == mapper.records_skipped == (0 if mapper.source != "text" else 2)


def test_skipped_records_reach_metrics(tmp_path):
    """The registry's count of records left out is exported, so an operator sees hostile names at work."""
    from types import SimpleNamespace

    from clusterwatch.collector.export import ClusterCollector
    from clusterwatch.collector.service import CollectorServer

    server = CollectorServer(CollectorConfig(db_path=str(tmp_path / "cw.db")))
    assert "clusterwatch_slurm_records_skipped" not in server.counter_values()  # no Slurm, no such count
    server._registry = SimpleNamespace(records_skipped=3)
    collector = ClusterCollector(server.core.state, server.core.clock, False, counters=server.counter_values)
    text = generate_latest(_registry_of(collector)).decode()
    assert "clusterwatch_slurm_records_skipped_total 3.0" in text


def _registry_of(collector):
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry
