"""`clusterwatch replay`: formats, bad lines, bad rules file."""
import json
import random

from click.testing import CliRunner
from clusterwatch.cli.replay_cmd import replay

from tests.synth_traces import make


def _trace(tmp_path, kind="nccl_hang", extra=b""):
    tr = make(kind, random.Random("replay"), interval=20)
    p = tmp_path / "t.jsonl"
    p.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in tr.rows) + extra)
    return p, tr


def test_jsonl_events(tmp_path):
    p, tr = _trace(tmp_path)
    res = CliRunner().invoke(replay, [str(p), "--format", "jsonl"])
    assert res.exit_code == 0, res.output
    evs = [json.loads(x) for x in res.stdout.splitlines()]
    firing = [e for e in evs if e["state"] == "firing"]
    assert firing and firing[0]["rule"] == "training_stall"
    for key in ("t", "rule", "state", "job_id", "node", "pid", "gpu", "stalled_for_s", "description"):
        assert key in firing[0]
    assert tr.expect[0].after <= firing[0]["t"] <= tr.expect[0].before


def test_human_default(tmp_path):
    p, _ = _trace(tmp_path)
    res = CliRunner().invoke(replay, [str(p)])
    assert res.exit_code == 0
    assert "training_stall" in res.stdout and "stuck at step" in res.stdout


def test_bad_lines_counted_not_fatal(tmp_path):
    p, _ = _trace(tmp_path, extra=b"{not json\n[1,2]\n{\"t\": 5}\n")
    res = CliRunner().invoke(replay, [str(p), "--format", "jsonl"])
    assert res.exit_code == 0
    assert "skipped 3 malformed line(s)" in res.stderr and str(p) in res.stderr
    assert any(json.loads(x)["state"] == "firing" for x in res.stdout.splitlines())


def test_bad_rules_file_exits_2(tmp_path):
    p, _ = _trace(tmp_path)
    rules = tmp_path / "r.toml"
    rules.write_text("[gpu_stall]\nfor_s = -3\n")
    res = CliRunner().invoke(replay, [str(p), "--rules", str(rules)])
    assert res.exit_code == 2
    assert f"{rules}: line 2" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_missing_trace_exits_2(tmp_path):
    res = CliRunner().invoke(replay, [str(tmp_path / "none.jsonl")])
    assert res.exit_code == 2 and "cannot read the trace" in res.stderr


def test_gpu_and_node_records(tmp_path):
    lines = [{"kind": "node", "t": 0, "node": "n9"}, {"kind": "gpu", "t": 0, "node": "n9", "gpu": "GPU-z",
                                                     "job_id": "5", "utilization": 0, "processes": 0}]
    lines += [{"kind": "gpu", "t": 60.0 * i, "node": "n9", "gpu": "GPU-z", "job_id": "5", "utilization": 0,
               "processes": 0} for i in range(1, 40)]
    lines += [{"kind": "node", "t": 3000, "node": "n9"}]
    p = tmp_path / "g.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    res = CliRunner().invoke(replay, [str(p), "--format", "jsonl"])
    got = [(e["rule"], e["state"]) for e in map(json.loads, res.stdout.splitlines())]
    assert ("idle_gpu", "firing") in got and ("agent_down", "firing") in got and ("agent_down", "resolved") in got


def test_a_trace_without_one_valid_line_exits_1_with_one_line(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    garbage = tmp_path / "rules.toml"
    garbage.write_text('[gpu_stall]\nfor_s = 30\n{"t": 1, "node": "n1"}\n')
    for path, why in ((empty, "the file has no line"), (garbage, "skipped 3 malformed line(s) (line 1: not JSON")):
        res = CliRunner().invoke(replay, [str(path), "--format", "jsonl"])
        assert res.exit_code == 1, res.output
        assert res.stdout == ""
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and f"{path}: no valid trace line" in lines[0] and why in lines[0], res.stderr


def test_a_replay_that_raises_nothing_says_so(tmp_path):
    rows = [{"t": 60.0 * i, "node": "n1", "pid": 7, "gpu_mem_bytes": 1 << 30, "gpu_util": 90.0, "rss_bytes": 1 << 30}
            for i in range(30)]
    p = tmp_path / "calm.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = CliRunner().invoke(replay, [str(p), "--format", "jsonl"])
    assert res.exit_code == 0 and res.stdout == ""
    assert res.stderr.strip() == f"clusterwatch replay: {p}: no alert raised over 30 observations"
