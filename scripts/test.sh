#!/usr/bin/env bash
# The test command: set up everything on a fresh machine, then run every test.
# The tests start (and stop, by pid) the real services they need: a two-node Slurm
# cluster with munge, an OpenSSH server, Prometheus, and clusterwatch's own processes.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m slurm`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
exec .venv/bin/python -m pytest "$@"
