"""One exception hierarchy for clusterwatch.

    ClusterwatchError            base: its message is one line a person can act on
    ├── ConfigError              a flag, variable or config/rules file is wrong
    ├── SourceUnavailable        a data source (NVML, /proc, Slurm) cannot be used at all
    ├── ParseError               a text we read (scontrol, hostlist, trace line) is malformed
    └── CollectorUnreachable     the collector does not answer
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
