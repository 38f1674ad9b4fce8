"""One exception hierarchy for clusterwatch: every error a user can see is a ClusterwatchError.

    ClusterwatchError            base: its message is one line a person can act on
    ├── ConfigError              a flag, variable or TOML file (clusterwatch/toml_file.py) is wrong
    │   └── CatalogError         the XID catalog (collector/health/xid_catalog.py)
    ├── SourceUnavailable        a data source (NVML, /proc, Slurm) cannot be used at all
    │   └── SlurmUnavailable     (collector/jobmap/base.py)
    ├── ParseError               a text we read (scontrol, hostlist, trace line) is malformed
    ├── CollectorUnreachable     the collector does not answer
    └── where they are raised:   SpoolTaken, SpoolNotPrivate, SocketTaken (agent/), StoreBehind (collector/)

A command that does not say an error itself leaves it to the console script (cli/main.py), which
prints it as one line and exits 2 for a ConfigError, 1 for the rest. ValueError and OSError stay for
what a caller handles (a malformed datagram, a bad HTTP answer) and for a library's own misuse.
"""


class ClusterwatchError(Exception):
    """Base class; str(exc) is one line that says what is wrong and what to do."""


class ConfigError(ClusterwatchError):
    """Bad configuration: a flag, an environment variable, a config or rules file."""


class SourceUnavailable(ClusterwatchError):
    """A source cannot be used at all (no NVML library, no GPU, no Slurm)."""


class ParseError(ClusterwatchError, ValueError):
    """A text could not be parsed; the message names the text and what was expected."""


class CollectorUnreachable(ClusterwatchError):
    """The collector did not answer at the given address."""
