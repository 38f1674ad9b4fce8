#!/usr/bin/env bash
# Install what clusterwatch and its tests need on a fresh Debian 12 machine, idempotently:
# Python 3 with venv, Debian's Slurm, munge, Prometheus (promtool), OpenSSH server, git, gcc (the tests build a C stand-in
# for the NVIDIA driver library with it) and systemd (systemd-analyze, for
# the shipped units; nothing is started with it) and chromium with its driver (the job page's browser
# tests), VictoriaMetrics (victoria-metrics: the engine behind Prometheus remote_write, with vmalert) as root, then a
# virtual environment in .venv with clusterwatch installed editable and, at the exact versions of
# requirements/dev.txt, its dependencies and dev tools (a release since cannot break a fresh clone).
set -euo pipefail
cd "$(dirname "$0")/.."

DEBS=(python3 python3-venv slurmctld slurmd slurm-client munge prometheus openssh-server git gcc libc6-dev systemd
      chromium chromium-driver victoria-metrics prometheus-alertmanager)
missing=()
for pkg in "${DEBS[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup: needs root to install Debian packages: ${missing[*]} (run as root, or install them first)" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
LOCK=requirements/dev.txt
# pip first (a pinned one installs the rest), then everything else at its pinned version
.venv/bin/python -m pip install -q --constraint "$LOCK" pip
.venv/bin/python -m pip install -q --requirement "$LOCK"
# Not editable_mode=strict, though its plain path entry would spare every start-up the editable
# finder's imports (python -c pass 42 -> 18 ms; status gains ~2 ms, it imports most of them anyway):
# its link tree (build/__editable__.*) is shadowed by the checkout's own clusterwatch/ folder whenever
# the repository root is on sys.path (pytest's pythonpath, `python -m clusterwatch.cli.main` run
# there), and then clusterwatch.cli, .agent, .collector and .v1 cannot be found.
# --no-deps: the lock installed them; --no-build-isolation: built with the lock's setuptools, not the latest
.venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
