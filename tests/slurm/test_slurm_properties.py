"""Property tests: hostlists round-trip, and parsers fail only with ParseError on any input."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from clusterwatch.errors import ParseError
from clusterwatch.slurm import hostlist
from clusterwatch.slurm.listpids import parse_listpids
from clusterwatch.slurm.proc import environ_labels, parse_cgroup, parse_environ
from clusterwatch.slurm.scontrol import parse_show_job, read_one_job_text, read_show_job_text

_prefix = st.text(alphabet="abcxyz-_.", min_size=1, max_size=5)
_number = st.integers(min_value=0, max_value=2000)
_width = st.integers(min_value=0, max_value=5)


@st.composite
def host_names(draw: st.DrawFn) -> str:
    prefix = draw(_prefix)
    if draw(st.booleans()):
        return prefix.rstrip("0123456789") or "h"
    return f"{prefix}{draw(_number):0{draw(_width)}d}"


@given(st.lists(host_names(), max_size=40))
def test_compress_then_expand_gives_the_names_back(hosts: list[str]) -> None:
    assert hostlist.expand(hostlist.compress(hosts)) == hosts


@given(st.lists(st.tuples(_prefix, st.lists(_number, min_size=1, max_size=10, unique=True)), max_size=5))
def test_expand_then_compress_then_expand_is_stable(groups: list[tuple[str, list[int]]]) -> None:
    expr = ",".join(f"{p}[{','.join(map(str, sorted(nums)))}]" for p, nums in groups)
    hosts = hostlist.expand(expr)
    # the names the expression stands for, written out from the groups, not from expand's own answer
    assert hosts == [f"{p}{n}" for p, nums in groups for n in sorted(nums)]
    assert hostlist.expand(hostlist.compress(hosts)) == hosts


_hostlist_chars = st.text(alphabet="ab01-9[],_ .", max_size=30)


@settings(max_examples=300)
@given(st.one_of(st.text(max_size=40), _hostlist_chars))
def test_expand_never_crashes(text: str) -> None:
    try:
        result = hostlist.expand(text, max_hosts=10_000)
    except ParseError as exc:
        assert "\n" not in str(exc)
    else:
        assert isinstance(result, list) and all(isinstance(h, str) for h in result)


_scontrol_words = st.sampled_from(
    [
        "JobId=1",
        "JobId=x",
        "JobState=RUNNING",
        "NodeList=n[1-2]",
        "Nodes=n1",
        "GRES=gpu:1(IDX:0)",
        "GRES=gpu(",
        "TimeLimit=1-00:00",
        "SubmitTime=2026-01-01T00:00:00",
        "SubmitTime=9999-99-99T00:00:00",
        "Mem=12",
        "UserId=a(1)",
        "ExitCode=1:2",
        "TRES=mem=1G",
        "MinMemoryNode=5G",
        "\n",
        "\n\n",
        " ",
        "=",
        "{",
        "}",
        '"jobs"',
        ":",
        "[",
        "]",
        "NumCPUs=2",
        "CPU_IDs=0",
        "JobName=",
        "JobId=1 JobName=",
        "\n   UserId=a(1) GroupId=a(1) MCS_label=N/A",
        "\n   ",
        "\n     Nodes=n1 CPU_IDs=0 Mem=0 GRES=",
        "\r",
    ]
)


@settings(max_examples=300)
@given(st.one_of(st.text(max_size=200), st.lists(_scontrol_words, max_size=30).map(" ".join)))
def test_show_job_raises_only_parse_error(text: str) -> None:
    try:
        parse_show_job(text)
    except ParseError:
        pass


@settings(max_examples=300)
@given(st.lists(_scontrol_words, max_size=40).map("".join),
       st.dictionaries(st.integers(0, 3), st.tuples(st.integers(0, 2), st.sampled_from(["a", "b"])), max_size=3))
def test_text_readers_raise_only_parse_error_and_return_only_listed_owners(text: str, owners: dict) -> None:
    try:
        read = read_show_job_text(text, owners=owners)
    except ParseError:
        return
    # each record left out has its line, and no job is both read and asked for again
    assert read.skipped <= len(read.errors), (read.skipped, read.errors)
    assert not {r.job_id for r in read.records} & set(read.recheck)
    for record in read.records:  # with the owners list, no record carries an owner it does not give
        assert (record.uid, record.user) == owners[record.job_id]
    for job_id in range(4):
        try:
            one = read_one_job_text(text, job_id, owner=owners.get(job_id))
        except ParseError:
            continue
        assert one is None or job_id not in owners or (one.uid, one.user) == owners[job_id]


@settings(max_examples=200)
@given(
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5)),
        lambda children: st.one_of(
            st.lists(children, max_size=3),
            st.dictionaries(
                st.sampled_from(
                    [
                        "jobs",
                        "job_id",
                        "job_state",
                        "nodes",
                        "gres_detail",
                        "time_limit",
                        "set",
                        "number",
                        "infinite",
                        "exit_code",
                        "return_code",
                        "cpus",
                        "memory_per_node",
                        "pids",
                        "pid",
                        "step_id",
                    ]
                ),
                children,
                max_size=5,
            ),
        ),
        max_leaves=20,
    )
)
def test_json_parsers_raise_only_parse_error(doc: object) -> None:
    import json

    text = json.dumps({"jobs": [doc]} if not isinstance(doc, dict) else doc)
    for parse in (parse_show_job, parse_listpids):
        try:
            parse(text)
        except ParseError:
            pass


@settings(max_examples=300)
@given(st.text(max_size=200))
def test_listpids_and_cgroup_raise_only_parse_error(text: str) -> None:
    for parse in (parse_listpids, parse_cgroup):
        try:
            parse(text)
        except ParseError:
            pass


@given(st.binary(max_size=300))
def test_environ_never_fails_on_bytes(data: bytes) -> None:
    environ_labels(parse_environ(data))


_env_names = st.text(st.characters(blacklist_characters="=\0", blacklist_categories=("Cs",)), min_size=1, max_size=12)
_env_values = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=20)


@given(st.dictionaries(_env_names, _env_values, max_size=8))
def test_environ_gives_back_the_variables_it_was_written_from(env: dict[str, str]) -> None:
    data = b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())
    assert parse_environ(data) == env
