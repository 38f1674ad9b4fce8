"""job_slowdown's precision and localisation on generated traces, beside the field's published figures.

    .venv/bin/python bench/bench_slowdown.py [--seeds 3]

Runs the shipped rules over tests/support/slowdown_traces.py's grid: every culprit (a GPU's clocks held
down, a power-capped GPU, a hotter GPU, the rank whose GPU works less, a rank held in D, none) at 25, 35
and 50 % slower, a slowdown that recovers, a job without steps judged from its GPUs, and the look-alikes
(evaluation phases, long checkpoint saves, a data-loader warm-up, an lr warm-up drift, noise, GPUs at their
power cap together, one GPU held down for three minutes once). Prints one table.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clusterwatch.collector.rules import load_rules  # noqa: E402

from tests.support.slowdown_traces import generate, gpu_of, scenarios  # noqa: E402

#: The published figures (docs: /work/shared/reference/FIELD-2026-12.md, § the field's fail-slow systems).
PUBLISHED = [
    ("Greyhound (ATC'25)", "> 99 % fail-slow detection accuracy", "online (BOCD)"),
    ("Holmes (NSDI'25)", "97.21 % localisation accuracy (simulation)", "30.3 s"),
    ("Minder (NSDI'25)", "precision 0.904, F1 0.893 (faulty machine)", "3.6 s"),
    ("CCL-D (2026)", "faulty rank located", "within 6 min"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    rules = load_rules()
    rows: dict[str, dict] = defaultdict(lambda: {"expected": 0, "caught": 0, "false": 0, "named": 0, "delays": []})
    for sc in scenarios(args.seeds):
        group = ("gpu side: " if not sc.steps else "") + (sc.culprit or "look-alikes")
        row = rows[group]
        fired = [e for e in generate(sc).run(rules) if e.rule == "job_slowdown" and e.state == "firing"]
        if not sc.is_fault:
            row["false"] += len(fired)
            continue
        row["expected"] += 1
        ok = [e for e in fired if sc.start_s <= e.t <= sc.start_s + 1800]
        row["false"] += len(fired) - len(ok)
        if not ok:
            continue
        e = ok[0]
        row["caught"] += 1
        row["delays"].append(e.t - sc.start_s)
        f = e.figures
        if sc.culprit == "none":
            row["named"] += f.get("cause") == "none"
        else:
            row["named"] += f.get("cause") == sc.culprit and f.get("cause_rank") == sc.culprit_rank and (
                sc.culprit not in ("gpu_clocks", "gpu_power_cap", "gpu_hot") or f.get("cause_gpu") == gpu_of(
                    sc.culprit_rank))
    print(f"job_slowdown on generated traces ({args.seeds} seeds a case), the shipped rules")
    print(f"{'case':<28}{'caught/expected':>16}{'false alarms':>14}{'median delay':>14}{'culprit named':>15}")
    tot = defaultdict(int)
    alld: list[float] = []
    for group, row in rows.items():
        d = f"{median(row['delays']) / 60:.1f} min" if row["delays"] else "-"
        caught = f"{row['caught']}/{row['expected']}" if row["expected"] else "-"
        named = f"{row['named']}/{row['caught']}" if row["expected"] else "-"
        print(f"{group:<28}{caught:>16}{row['false']:>14}{d:>14}{named:>15}")
        for k in ("expected", "caught", "false", "named"):
            tot[k] += row[k]
        alld += row["delays"]
    precision = tot["caught"] / (tot["caught"] + tot["false"]) if tot["caught"] + tot["false"] else 0.0
    print(f"{'all':<28}{tot['caught']:>13}/{tot['expected']:<2}{tot['false']:>14}{median(alld) / 60:>10.1f} min"
          f"{tot['named']:>12}/{tot['caught']}")
    print(f"precision {precision:.3f}, recall {tot['caught'] / tot['expected']:.3f}, "
          f"culprit named {tot['named'] / max(1, tot['caught']):.3f}")
    print("\npublished (FIELD-2026-12.md):")
    for name, what, delay in PUBLISHED:
        print(f"  {name:<20} {what:<45} {delay}")


if __name__ == "__main__":
    main()
