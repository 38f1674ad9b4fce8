"""clusterwatch: per-process GPU and host monitoring for Slurm training jobs.

This top-level package holds only what the agent and the collector share (the
sample model, errors, config loading, Slurm text parsers) and the training-side
`clusterwatch.train` module; `clusterwatch.agent` and `clusterwatch.collector`
never import each other.
"""

__version__ = "0.1.0"
