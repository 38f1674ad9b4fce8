"""Which code a process runs: a git provenance record for a pid or a directory.

For a process, the record holds the git state of the repository that contains its
script (the first non-option argument of a Python command line) or, failing that,
its working directory; its command line (secret-looking option values redacted),
its executable, and the environment variables that matter to a run (secret-looking
names dropped). For a directory (`clusterwatch provenance DIR`), the git state only.

Git runs as the process's owner (its real uid and gid, and its supplementary groups,
from /proc/<pid>/status), or, for a directory probed by root, as the directory's owner;
never as root in somebody else's repository. The real uid is the one a user cannot
borrow: a setuid-root program a user starts runs with effective uid 0, and git run as
that would be root in the user's repository. `clusterwatch.agent.gitrun` lists what
is switched off. What is left, and why it is acceptable:

- Whatever still runs, runs as the repository's (the process's) owner, who could
  run it anyway: git is never a way up to root.
- Config is read before each git call to find the filter and diff drivers to empty.
  The owner can change the config between that read and the call (a race that
  gains nothing: see above).
- git's own built-ins run (the index is read, and so is every included config file),
  as the owner, under a timeout. A repository the owner can make git loop on, or a
  FIFO in the work tree, costs at most the time budget (5 s by default).
- Untracked counts ignore the owner's global excludes file, because the global
  config is not read (it could name drivers too, and ranks must agree).
- Drivers that are emptied change what git sees: files under a clean filter (git-lfs)
  whose stat data is stale in the index may count as modified. A false "dirty" is
  the safe error.
- Since git 2.35.2 git refuses a repository owned by another uid than the one it
  runs as ("dubious ownership"); a process working in somebody else's checkout gets
  `unknown` with that reason. safe.directory is never set.

Every failure (no repository, no git, a timeout, an unreadable /proc) yields a record
whose git fields say "unknown" with a reason, and a warning logged once per kind of
failure; nothing is raised to the caller.

The modules, one job each: `record` (the record's shape), `process` (what /proc says of a
process), `git_output` (git's answers parsed), `git_probe` (git run as the owner, into a
GitState), `cache` (states shared by the ranks of one checkout), `failures` (logged once a
kind), `of_process` and `of_directory` (a record assembled for a pid, for a directory).
"""

from __future__ import annotations

from clusterwatch.agent.provenance.cache import GitStateCache
from clusterwatch.agent.provenance.git_output import StatusParser, parse_config_list, parse_status
from clusterwatch.agent.provenance.git_probe import git_state
from clusterwatch.agent.provenance.of_directory import owner_of, provenance_of_dir
from clusterwatch.agent.provenance.of_process import provenance_of_pid
from clusterwatch.agent.provenance.process import parse_proc_ids, script_path
from clusterwatch.agent.provenance.record import (
    RECORD_VERSION,
    UNKNOWN,
    GitState,
    Provenance,
    ProvenanceConfig,
    Submodule,
)

from clusterwatch.procfs import process_start_time

__all__ = [
    "RECORD_VERSION", "UNKNOWN", "GitState", "GitStateCache", "Provenance", "ProvenanceConfig",
    "StatusParser", "Submodule", "git_state", "owner_of", "parse_config_list", "parse_proc_ids",
    "parse_status", "process_start_time", "provenance_of_dir", "provenance_of_pid", "script_path",
]
