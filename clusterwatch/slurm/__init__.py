"""Pure parsers for Slurm texts shared by agent and collector: hostlists, scontrol, /proc cgroup and environ."""
