#!/usr/bin/env bash
# The test command: set up everything on a fresh machine, then run every test.
# The tests start (and stop, by pid) the real services they need: a two-node Slurm cluster with munge,
# an OpenSSH server, Prometheus, and clusterwatch's own processes; each pytest-xdist worker starts its own.
# Two passes, both always run: the tests in parallel, then, alone, those marked `serial` (they measure CPU
# or time, which other tests on the machine would skew). Non-zero if either fails.
# The parallel pass runs three workers on the CI machine's two cores: the tests mostly wait on processes
# and sockets (2026-12-01: 1,446 tests in 1,014 s on three workers at 67f3bde, 1,359 in 982 s on two at
# 0ad122a), and a worker out of tests takes those queued on another (--dist worksteal), so that the slow
# end-to-end ones do not leave one worker running alone at the end.
# Extra arguments go to both passes, e.g. `bash scripts/test.sh -m slurm` or `bash scripts/test.sh -x`;
# a -m expression is joined to each pass's own; a later `-n N` sets the parallel pass's workers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .

# the caller's -m EXPR, taken out of the arguments to be joined to each pass's marker expression
marks="" args=()
while [ "$#" -gt 0 ]; do
    case "$1" in
        -m) marks="$2"; shift 2 ;;
        -m=*) marks="${1#-m=}"; shift ;;
        -m?*) marks="${1#-m}"; shift ;;
        *) args+=("$1"); shift ;;
    esac
done
with() { if [ -n "$marks" ]; then echo "($marks) and $1"; else echo "$1"; fi; }

# pytest's exit status 5 is "no tests collected": a selection may leave one pass empty
parallel=0 serial=0
# --durations: each run's slowest tests in its log, where the suite's time goes
.venv/bin/python -m pytest -n 3 --dist worksteal --durations=20 -m "$(with "not serial")" ${args[@]+"${args[@]}"} || parallel=$?
.venv/bin/python -m pytest -m "$(with serial)" ${args[@]+"${args[@]}"} -n 0 || serial=$?
echo "test.sh: parallel pass exit $parallel, serial pass exit $serial" >&2
if [ "$parallel" -eq 5 ] && [ "$serial" -eq 5 ]; then exit 5; fi
for rc in "$parallel" "$serial"; do
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then exit "$rc"; fi
done
exit 0
