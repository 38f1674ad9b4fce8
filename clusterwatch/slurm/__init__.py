"""Pure parsers for Slurm texts (hostlists, scontrol, /proc cgroup and environ) shared by agent and collector."""
