#!/bin/sh
# Slurm Epilog for clusterwatch: tell this node's agent the job ended (with its exit code), so its last
# samples go out and the collector closes the job. Always exits 0; see prolog.sh and README.md.
CLUSTERWATCH=${CLUSTERWATCH:-/opt/clusterwatch/bin/clusterwatch}
LOG_DIR=${CLUSTERWATCH_HOOK_LOG_DIR:-/var/log/clusterwatch}
if [ -r /etc/clusterwatch/hooks.env ]; then
    set -a
    . /etc/clusterwatch/hooks.env
    set +a
fi
mkdir -p "$LOG_DIR" 2>/dev/null
"$CLUSTERWATCH" epilog 2>>"$LOG_DIR/hooks-${SLURMD_NODENAME:-node}.log" </dev/null >/dev/null
exit 0
