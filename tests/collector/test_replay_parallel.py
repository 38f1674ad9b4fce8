"""Replay split over several processes gives exactly the events of one engine, in the same order."""
import json
import random

from click.testing import CliRunner
from clusterwatch.cli.replay_cmd import replay
from clusterwatch.collector.rules import load_rules
from clusterwatch.collector.traces.replay import ReplayStats, replay_file

from tests.synth_traces import make

RULES = load_rules()


def _mixed_rows():
    """Several kinds on distinct processes, interleaved in time, with GPU and node records."""
    rows = []
    for i, kind in enumerate(("rank_leak", "util_stall", "nccl_hang", "host_leak", "fast_leak", "one_step")):
        tr = make(kind, random.Random(f"par-{kind}"), interval=30)
        for r in tr.rows:
            rows.append({**r, "pid": r["pid"] + 1000 * i, "job_id": str(7000 + i)})
    t_end = max(r["t"] for r in rows)
    t = 0.0
    while t < t_end:
        rows.append({"kind": "gpu", "t": t, "node": "gpu900", "gpu": "GPU-idle", "job_id": "42",
                     "utilization": 0.0, "processes": 0})
        if t < 3000 or t > 6000:  # the node falls silent for a while: agent_down fires and resolves
            rows.append({"kind": "node", "t": t, "node": "gpu900", "has_jobs": True})
        t += 30.0
    rows.sort(key=lambda r: r["t"])
    return rows


def _write(path, rows, spell=None):
    with open(path, "wb") as f:
        for i, r in enumerate(rows):
            line = json.dumps(r, separators=(",", ":"))
            f.write((spell(i, line) if spell else line).encode() + b"\n")
        f.write(b"{not json\n")


def _replay(path, workers):
    st = ReplayStats()
    evs = [e.to_dict() for e in replay_file(path, RULES, st, workers=workers)]
    return evs, (st.samples, st.bad_lines, st.first_bad)


def test_workers_give_one_engines_events(tmp_path):
    p = tmp_path / "mixed.jsonl"
    _write(p, _mixed_rows())
    one, stats_one = _replay(p, 1)
    rules = {(e["rule"], e["state"]) for e in one}
    assert {("gpu_memory_leak", "firing"), ("host_memory_leak", "firing"), ("gpu_stall", "firing"),
            ("training_stall", "firing"), ("idle_gpu", "firing"), ("agent_down", "firing"),
            ("agent_down", "resolved")} <= rules
    for k in (2, 3, 4):
        assert _replay(p, k) == (one, stats_one), k


def test_one_pid_spelled_two_ways_still_gives_one_engines_events(tmp_path):
    # Every other line writes `"pid": N` with a space: the text a reader routes on differs
    # within one series, the shares overlap, and replay falls back to one process.
    p = tmp_path / "spelled.jsonl"
    _write(p, _mixed_rows(), spell=lambda i, line: line.replace('"pid":', '"pid": ') if i % 2 else line)
    q = tmp_path / "plain.jsonl"
    _write(q, _mixed_rows())
    assert _replay(p, 2) == _replay(q, 1)


def test_cli_jobs_option(tmp_path):
    p = tmp_path / "mixed.jsonl"
    _write(p, _mixed_rows())
    outs = []
    for jobs in ("1", "2"):
        res = CliRunner().invoke(replay, [str(p), "--format", "jsonl", "--jobs", jobs])
        assert res.exit_code == 0, res.output
        assert "skipped 1 malformed line(s) (line " in res.stderr
        outs.append(res.stdout)
    assert outs[0] == outs[1] and outs[0].count("\n") > 10
