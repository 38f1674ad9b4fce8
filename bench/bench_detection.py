"""Detection quality of the leak and stall rules: caught, false alarms and delay, per kind of trace.

    python bench/bench_detection.py [--draws 10] [--kinds a,b] [--no-dev] [--no-anchor] [--quick]

For every kind of tests/synth_traces.py, `--draws` seeded draws (the poll interval cycles
through 1, 5, 10, 15, 20, 30, 45, 60 s, so every interval is drawn), each run through the
rules engine as shipped (the default rules file, in process, as `replay` runs it). Per kind:
alerts caught in their window / expected, false alarms (firing events no expected alert
explains, as score.py counts them), median and p90 delay (minutes from the leak's or stall's
start, the window's `after`, to the first firing event in the window). Then the median over
every expected alert caught, and the labelled dev traces (/work/shared/traces/dev, or
$CLUSTERWATCH_TRACES) scored by score.py: the rules through `clusterwatch replay`, beside the
PromQL-style reference detector (`--anchor promql`) in the same run. The PromQL anchor also
runs on the generated draws polled every 15 s or slower (at finer polls its hour of raw
samples a point is too slow in Python): its column counts those draws only.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from clusterwatch.collector.rules import Engine, load_rules  # noqa: E402

from tests.synth_traces import KINDS, check, make  # noqa: E402

INTERVALS = (1, 5, 10, 15, 20, 30, 45, 60)
TRACES = Path(os.environ.get("CLUSTERWATCH_TRACES", "/work/shared/traces"))
ANCHOR_MIN_INTERVAL = 15


def _score_module():
    path = TRACES / "score.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location("score", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _events(rules, rows) -> list[dict]:
    eng = Engine(rules)
    out: list[dict] = []
    for row in rows:
        out += [e.to_dict() for e in eng.observe_mapping(row)]
    return out


def _delays(events: list[dict], expect) -> list[float]:
    """Minutes from each expected alert's `after` to its first firing event inside its window."""
    out = []
    for x in expect:
        ts = [e["t"] for e in events if e["state"] == "firing" and e["rule"] in x.rules and e["node"] == x.node
              and e["pid"] == x.pid and x.after <= e["t"] <= x.before]
        if ts:
            out.append((min(ts) - x.after) / 60.0)
    return out


def noise_bound_min(tr) -> float:
    """The least delay the noise allows, in minutes (nan where the kind has none to compute).

    A linear leak's is tests/synth_traces.py's `noise_bound_h` on its own noise (docs/rules.md, "How fast a
    leak can be told"); a staircase is told at its third step (two can be unrelated events): two periods
    after the first. Stalls wait for the rule's for_s.
    """
    p = tr.params
    if "period" in p and "rate" in p:
        return 2 * p["period"] / 60.0
    return p.get("bound_h", float("nan")) * 60.0


def _p(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def run_kind(kind: str, draws: int, rules, score) -> dict:
    caught = expected = false = 0
    delays: list[float] = []
    bounds: list[float] = []
    a_caught = a_expected = a_false = 0
    a_delays: list[float] = []
    for seed in range(draws):
        iv = INTERVALS[seed % len(INTERVALS)]
        tr = make(kind, random.Random(f"bench-{kind}-{seed}"), interval=iv)
        ev = _events(rules, tr.rows)
        missed, fa = check(ev, tr.expect)
        expected += len(tr.expect)
        caught += len(tr.expect) - len(missed)
        false += len({(r, n, p) for r, n, p, _ in fa})
        delays += _delays(ev, tr.expect)
        bounds += [b for b in (noise_bound_min(tr) for _ in tr.expect) if b == b]
        if score is not None and iv >= ANCHOR_MIN_INTERVAL:
            aev = score.anchor_promql(tr.rows)
            for e in aev:
                e.setdefault("state", "firing")
            am, afa = check(aev, tr.expect)
            a_expected += len(tr.expect)
            a_caught += len(tr.expect) - len(am)
            a_false += len({(r, n, p) for r, n, p, _ in afa})
            a_delays += _delays(aev, tr.expect)
    return dict(kind=kind, caught=caught, expected=expected, false=false, delays=delays, bounds=bounds,
                a_caught=a_caught, a_expected=a_expected, a_false=a_false, a_delays=a_delays)


def dev_score(args: list[str]) -> str:
    """score.py's total line on the dev traces for `args` (--cmd ... or --anchor ...)."""
    cmd = [sys.executable, str(TRACES / "score.py"), str(TRACES / "dev"), "-q", *args]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    env = {k: v for k, v in env.items() if not k.startswith("CLUSTERWATCH_") or k == "CLUSTERWATCH_TRACES"}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("caught")]
    return lines[-1] if lines else f"score.py failed: {p.stderr.strip()[-200:]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draws", type=int, default=10)
    ap.add_argument("--kinds", default="", help="comma-separated kinds (default: all)")
    ap.add_argument("--no-dev", action="store_true", help="skip the dev traces")
    ap.add_argument("--no-anchor", action="store_true", help="skip the PromQL-style reference")
    ap.add_argument("--quick", action="store_true", help="one draw of a few kinds, no dev traces (a smoke run)")
    a = ap.parse_args()
    if a.quick:
        a.draws, a.no_dev = 1, True
        a.kinds = a.kinds or "flat,one_step,linear_leak,util_stall"
    kinds = [k for k in a.kinds.split(",") if k] or list(KINDS)
    rules = load_rules()
    score = None if a.no_anchor else _score_module()
    rows = [run_kind(k, a.draws, rules, score) for k in kinds]

    def fmt(v: float) -> str:
        return "–" if v != v else f"{v:.0f}"

    print(f"{a.draws} draws a kind, poll intervals {', '.join(map(str, INTERVALS))} s in turn")
    print()
    print("| kind | caught | false alarms | median delay (min) | p90 delay (min) | noise bound, median (min) "
          f"| PromQL-style (draws at >= {ANCHOR_MIN_INTERVAL} s): caught, false, median |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        anchor = "–" if score is None else (f"{r['a_caught']}/{r['a_expected']}, {r['a_false']}, "
                                             f"{fmt(_p(r['a_delays'], 0.5)) if r['a_delays'] else '–'}")
        print(f"| {r['kind']} | {r['caught']}/{r['expected']} | {r['false']} | {fmt(_p(r['delays'], 0.5))} "
              f"| {fmt(_p(r['delays'], 0.9))} | {fmt(_p(r['bounds'], 0.5))} | {anchor} |")
    all_d = [d for r in rows for d in r["delays"]]
    a_all = [d for r in rows for d in r["a_delays"]]
    tot = (sum(r["caught"] for r in rows), sum(r["expected"] for r in rows), sum(r["false"] for r in rows))
    a_tot = (sum(r["a_caught"] for r in rows), sum(r["a_expected"] for r in rows), sum(r["a_false"] for r in rows))
    anchor = "–" if score is None else f"{a_tot[0]}/{a_tot[1]}, {a_tot[2]}, {fmt(_p(a_all, 0.5))}"
    all_b = [b for r in rows for b in r["bounds"]]
    print(f"| **all** | {tot[0]}/{tot[1]} | {tot[2]} | {_p(all_d, 0.5):.1f} | {fmt(_p(all_d, 0.9))} "
          f"| {fmt(_p(all_b, 0.5))} (leaks) | {anchor} |")
    leak_d = [d for r in rows if "stall" not in r["kind"] and "hang" not in r["kind"] for d in r["delays"]]
    print(f"\nmedian delay, leaks only: {statistics.median(leak_d) if leak_d else float('nan'):.1f} min")
    if not a.no_dev and (TRACES / "dev").is_dir():
        print(f"\ndev traces ({TRACES / 'dev'}):")
        print(f"  clusterwatch replay : {dev_score(['--cmd', 'clusterwatch replay {trace} --format jsonl'])}")
        if not a.no_anchor:
            print(f"  PromQL-style anchor : {dev_score(['--anchor', 'promql'])}")
    sys.stdout.flush()
    # The exit status says whether the generated draws all pass, as the tests ask.
    sys.exit(0 if tot[0] == tot[1] and tot[2] == 0 else 1)


if __name__ == "__main__":
    main()
