#!/usr/bin/env bash
# The main job: set up on a fresh machine, then run `clusterwatch demo` (a collector, two
# agents with simulated GPUs and a four-rank job with a leaking rank, live for 60 s).
# Extra arguments go to the demo, e.g. `bash scripts/demo.sh --duration 30`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/clusterwatch demo "$@"
