#!/bin/sh
# Slurm Prolog for clusterwatch: announce the job to this node's agent, start the agent if needed.
# slurmd drains a node whose Prolog fails or hangs: this script always exits 0, and
# `clusterwatch prolog` gives up by itself after 0.9 s.
# Settings: /etc/clusterwatch/config.toml [agent] (collector, token, gpu_source, spool_dir, interval),
# or CLUSTERWATCH_* variables set in /etc/clusterwatch/hooks.env. See README.md.
# The program: where docs/operators.md installs it (CLUSTERWATCH= in hooks.env names another place).
CLUSTERWATCH=${CLUSTERWATCH:-/opt/clusterwatch/venv/bin/clusterwatch}
HOOKS_ENV=${CLUSTERWATCH_HOOKS_ENV:-/etc/clusterwatch/hooks.env}
LOG_DIR=${CLUSTERWATCH_HOOK_LOG_DIR:-/var/log/clusterwatch}
if [ -r "$HOOKS_ENV" ]; then
    set -a
    . "$HOOKS_ENV"
    set +a
fi
mkdir -p "$LOG_DIR" 2>/dev/null
# One file per node: several slurmd on one host (and their hooks) never share it.
LOG="$LOG_DIR/hooks-${SLURMD_NODENAME:-node}.log"
if [ ! -x "$CLUSTERWATCH" ]; then
    # exit 0 all the same (a failing Prolog drains the node), but say it where an operator looks:
    # syslog, our own log, and stderr (which slurmd may keep, depending on its version and debug level)
    msg="clusterwatch prolog: $CLUSTERWATCH is missing or not executable, so job ${SLURM_JOB_ID:-?} is not watched; install clusterwatch there (docs/operators.md) or set CLUSTERWATCH= in $HOOKS_ENV"
    echo "$msg" >&2
    echo "$msg" >>"$LOG" 2>/dev/null
    timeout 1 logger -t clusterwatch -p daemon.warning -- "$msg" </dev/null >/dev/null 2>&1
    exit 0
fi
"$CLUSTERWATCH" prolog 2>>"$LOG" </dev/null >/dev/null
exit 0
