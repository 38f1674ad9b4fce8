"""Shared pytest fixtures. Service fixtures (Slurm, sshd) live in tests/services/ and load as plugins."""

pytest_plugins = ["tests.services.slurm", "tests.services.sshd", "tests.services.prometheus", "tests.services.munge"]
