#!/bin/sh
# Slurm Epilog for clusterwatch: tell this node's agent the job ended (with its exit code), so its last
# samples go out and the collector closes the job. Always exits 0; see prolog.sh and README.md.
CLUSTERWATCH=${CLUSTERWATCH:-/opt/clusterwatch/venv/bin/clusterwatch}
HOOKS_ENV=${CLUSTERWATCH_HOOKS_ENV:-/etc/clusterwatch/hooks.env}
LOG_DIR=${CLUSTERWATCH_HOOK_LOG_DIR:-/var/log/clusterwatch}
if [ -r "$HOOKS_ENV" ]; then
    set -a
    . "$HOOKS_ENV"
    set +a
fi
mkdir -p "$LOG_DIR" 2>/dev/null
LOG="$LOG_DIR/hooks-${SLURMD_NODENAME:-node}.log"
if [ ! -x "$CLUSTERWATCH" ]; then
    msg="clusterwatch epilog: $CLUSTERWATCH is missing or not executable, so the end of job ${SLURM_JOB_ID:-?} is not recorded; install clusterwatch there (docs/operators.md) or set CLUSTERWATCH= in $HOOKS_ENV"
    echo "$msg" >&2
    echo "$msg" >>"$LOG" 2>/dev/null
    timeout 1 logger -t clusterwatch -p daemon.warning -- "$msg" </dev/null >/dev/null 2>&1
    exit 0
fi
"$CLUSTERWATCH" epilog 2>>"$LOG" </dev/null >/dev/null
exit 0
