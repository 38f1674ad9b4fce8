"""Modules the tests share: the processes and stacks they start, trainers, git repositories, local users."""
