"""Shared pytest fixtures. Service fixtures (Slurm, sshd, Prometheus) live in tests/services/."""
