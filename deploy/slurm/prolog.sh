#!/bin/sh
# Slurm Prolog for clusterwatch: announce the job to this node's agent, start the agent if needed.
# slurmd drains a node whose Prolog fails or hangs: this script always exits 0, and
# `clusterwatch prolog` gives up by itself after 0.9 s.
# Settings: /etc/clusterwatch/config.toml [agent] (collector, token, gpu_source, spool_dir, interval),
# or CLUSTERWATCH_* variables set in /etc/clusterwatch/hooks.env. See README.md.
CLUSTERWATCH=${CLUSTERWATCH:-/opt/clusterwatch/bin/clusterwatch}
LOG_DIR=${CLUSTERWATCH_HOOK_LOG_DIR:-/var/log/clusterwatch}
if [ -r /etc/clusterwatch/hooks.env ]; then
    set -a
    . /etc/clusterwatch/hooks.env
    set +a
fi
mkdir -p "$LOG_DIR" 2>/dev/null
# One file per node: several slurmd on one host (and their hooks) never share it.
"$CLUSTERWATCH" prolog 2>>"$LOG_DIR/hooks-${SLURMD_NODENAME:-node}.log" </dev/null >/dev/null
exit 0
