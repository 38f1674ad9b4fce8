"""The shard choice (clusterwatch/shards.py): stable, balanced, minimal movement; the config's collectors list."""
from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterwatch.config import load_default_map
from clusterwatch.errors import ConfigError
from clusterwatch.shards import Collectors, ShardError, parse_list, pick, slurm_job_number

collector_lists = st.lists(st.from_regex(r"[a-z][a-z0-9.-]{0,12}:[1-9][0-9]{0,4}", fullmatch=True),
                           min_size=2, max_size=12, unique=True).map(tuple)


def test_weight_is_the_same_in_another_process_whatever_its_hash_seed():
    # Python's hash() of a str differs per process; the shard must not
    code = "from clusterwatch.shards import pick; print(pick('4242', ('a:1', 'b:1', 'c:1', 'd:1')))"
    got = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={"PYTHONHASHSEED": seed}).stdout.strip() for seed in ("1", "2", "3")}
    assert got == {pick("4242", ("a:1", "b:1", "c:1", "d:1"))}


@settings(max_examples=40, deadline=None)
@given(collector_lists)
def test_balance_within_bounds(collectors):
    # 20,000 job ids over N collectors: each gets its share within ±25 % (the binomial spread is ~±5 %)
    n = 20_000
    counts = Counter(pick(str(100_000 + i), collectors) for i in range(n))
    share = n / len(collectors)
    assert set(counts) == set(collectors)
    assert all(0.75 * share <= c <= 1.25 * share for c in counts.values()), counts


@settings(max_examples=40, deadline=None)
@given(collector_lists, st.data())
def test_adding_a_collector_moves_only_keys_to_it_and_about_one_nth(collectors, data):
    new = "new-collector:50051"
    at = data.draw(st.integers(0, len(collectors)))  # wherever it goes in the list
    grown = collectors[:at] + (new,) + collectors[at:]
    keys = [f"node{i:05d}" for i in range(5_000)]
    moved = [k for k in keys if pick(k, collectors) != pick(k, grown)]
    assert all(pick(k, grown) == new for k in moved)  # nothing moves between the old collectors
    expected = len(keys) / len(grown)
    assert 0.7 * expected <= len(moved) <= 1.3 * expected


@settings(max_examples=40, deadline=None)
@given(collector_lists, st.data())
def test_removing_a_collector_moves_only_its_keys(collectors, data):
    gone = data.draw(st.sampled_from(collectors))
    shrunk = tuple(c for c in collectors if c != gone)
    for i in range(3_000):
        key = str(i)
        before = pick(key, collectors)
        assert pick(key, shrunk) == before or before == gone


def test_order_of_the_list_does_not_change_the_choice():
    a = ("c1:50051", "c2:50051", "c3:50051")
    assert all(pick(str(i), a) == pick(str(i), a[::-1]) for i in range(2_000))


def test_a_running_job_stays_on_the_earlier_list_new_jobs_use_the_new_one():
    old = ("c1:1", "c2:1")
    new = old + ("c3:1",)
    deployment = Collectors.parse(",".join(new), "5000=" + ",".join(old))
    moved = [j for j in range(4000, 5000) if pick(str(j), old) != pick(str(j), new)]
    assert moved  # some jobs would move under the new list alone...
    assert all(deployment.for_job(str(j)) == pick(str(j), old) for j in moved)  # ...but stay
    assert all(deployment.for_job(f"{j}_3") == pick(f"{j}_3", old) for j in moved)  # array task of an old job
    assert [deployment.for_job(str(j)) for j in range(5000, 5200)] == [pick(str(j), new) for j in range(5000, 5200)]
    assert deployment.for_job("run-abc") == pick("run-abc", new)  # not a Slurm number: the current list
    assert deployment.for_node("gpu001") == pick("gpu001", new)
    assert deployment.all == new


def test_a_collector_only_the_earlier_list_has_is_still_asked():
    d = Collectors.parse("c2:1,c3:1", "10=c1:1,c2:1")
    assert d.all == ("c2:1", "c3:1", "c1:1")


@pytest.mark.parametrize("text, message", [
    ("", "lists no collector"),
    ("a:1,,b:1", "has an empty entry"),
    ("a:1,b:1,a:1", "lists a:1 twice"),
])
def test_bad_lists_say_what_is_wrong(text, message):
    with pytest.raises(ShardError, match=message):
        parse_list(text)


@pytest.mark.parametrize("before", ["a:1", "x=a:1", "=a:1", "12="])
def test_bad_collectors_before(before):
    with pytest.raises(ShardError):
        Collectors.parse("a:1,b:1", before)


def test_slurm_job_numbers():
    assert [slurm_job_number(j) for j in ("4242", "4242_7", "4242+1", "run-1", "")] == [4242, 4242, 4242, None, None]


def write(tmp_path, text):
    path = tmp_path / "config.toml"
    path.write_text(text)
    return str(path)


def test_config_top_level_collectors_is_every_cli_commands_collector(tmp_path, monkeypatch):
    monkeypatch.delenv("CLUSTERWATCH_CONFIG", raising=False)
    path = write(tmp_path, 'collectors = ["c1:50051", "c2:50051"]\n'
                           'collectors_before = { job = 77, collectors = ["c1:50051"] }\n[agent]\ninterval = 2\n')
    got = load_default_map(path)
    for cmd in ("status", "jobs", "alerts", "record"):
        assert got[cmd] == {"collector": "c1:50051,c2:50051", "collectors_before": "77=c1:50051"}
    # the agent streams to each collector it has data for: the list, and its [agent] settings beside it
    assert got["agent"] == {"interval": 2, "collector": "c1:50051,c2:50051", "collectors_before": "77=c1:50051"}
    # the collector takes the list as its --collectors, to know its own jobs (--shard)
    assert got["collector"] == {"collectors": "c1:50051,c2:50051", "collectors_before": "77=c1:50051"}


def test_config_cli_collector_of_its_own_wins(tmp_path):
    got = load_default_map(write(tmp_path, 'collectors = ["c1:1", "c2:1"]\n[cli]\ncollector = "mine:1"\n'))
    assert got["status"]["collector"] == "mine:1"


@pytest.mark.parametrize("text, message", [
    ('collectors = "c1:1"\n', "must be a list"),
    ('collectors = []\n', "lists no collector"),
    ('collectors = ["a:1", "a:1"]\n', "twice"),
    ('collectors_before = { job = 1, collectors = ["a:1"] }\n', "without collectors"),
    ('collectors = ["a:1"]\ncollectors_before = { job = "x", collectors = ["a:1"] }\n', "must be"),
    ('colectors = ["a:1"]\n', "unknown section"),
])
def test_config_bad_collectors(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_default_map(write(tmp_path, text))
