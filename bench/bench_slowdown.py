"""job_slowdown's precision and localisation on generated traces, beside the field's published figures.

    .venv/bin/python bench/bench_slowdown.py [--seeds 3]

Runs the shipped rules over tests/support/slowdown_traces.py's grid: every culprit (a GPU's clocks held down,
a power-capped GPU, a hotter GPU, a GPU whose PCIe replays or NVLink errors climb, the rank whose GPU works
less, a rank held in D, none) at 25, 35 and 50 % slower; a GPU held thermally between the health reads (NVML's
violation time alone sees it), every GPU's link errors climbing together and one GPU's burst of replays an
hour before (no GPU to name); a slowdown that recovers, a job without steps judged from its GPUs, and the
look-alikes (evaluation phases, long checkpoint saves, a data-loader warm-up, an lr warm-up drift, noise, GPUs
at their power cap together, one GPU held down for three minutes once). Then jobs that count tokens beside
their steps (every poll, or with a framework's log every 5 or 15 minutes): the same slowdowns judged in
tokens/s, and a batch that doubles (steps/s halves, tokens/s holds), which is no slowdown, beside the same job
counting steps alone. Prints one table.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clusterwatch.collector.rules import load_rules  # noqa: E402

from tests.support.slowdown_traces import (  # noqa: E402
    CULPRITS,
    LOOKALIKES,
    WORK_LOOKALIKES,
    Scenario,
    generate,
    gpu_of,
    scenarios,
)

#: How often the tokens-counting jobs report their count: every poll, every 5 and every 15 minutes.
WORK_EVERY_S = (5.0, 300.0, 900.0)
#: The rows of a job that counts steps alone where a counted one is judged in tokens (left out of "all").
CONTRAST = "(steps alone) "

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
    for sc, group in [*_grid(args.seeds), *_tokens_grid(args.seeds)]:
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
                sc.culprit not in ("gpu_clocks", "gpu_power_cap", "gpu_hot", "gpu_link_errors")
                or f.get("cause_gpu") == gpu_of(
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
        if group.startswith(CONTRAST):
            continue  # what the rule would do without counts: shown, not the rule's own figures
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


def _grid(seeds: int) -> list[tuple[Scenario, str]]:
    return [(sc, ("gpu side: " if not sc.steps else "") + (sc.culprit or "look-alikes")
             + (f" ({sc.variant})" if sc.variant else "")) for sc in scenarios(seeds)]


def _every(s: float) -> str:
    return f"{s:g} s" if s < 60 else f"{s / 60:g} min"


def _tokens_grid(seeds: int) -> list[tuple[Scenario, str]]:
    """Jobs that count tokens: each culprit at 30 % and the look-alikes, at each report interval; the batch that
    doubles also on a job counting steps alone (what the tokens spare it)."""
    out = []
    for seed in range(seeds):
        for every in WORK_EVERY_S:
            for culprit in CULPRITS:
                out.append((Scenario(f"tokens-{culprit}", culprit=culprit, drop=0.3, seed=seed, culprit_rank=seed % 4,
                                     work="tokens", work_every_s=every), f"tokens every {_every(every)}"))
            for look in LOOKALIKES:
                out.append((Scenario(f"tokens-{look}", lookalike=look, seed=seed, work="tokens", work_every_s=every),
                            "tokens: look-alikes"))
            for look in WORK_LOOKALIKES:
                out.append((Scenario(f"tokens-{look}", lookalike=look, seed=seed, work="tokens", work_every_s=every),
                            "tokens: batch doubles"))
        for look in WORK_LOOKALIKES:
            out.append((Scenario(f"steps-{look}", lookalike=look, seed=seed), f"{CONTRAST}batch doubles"))
    return out


if __name__ == "__main__":
    main()
