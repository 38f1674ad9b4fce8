"""The collector: agents' batches in, the cluster's state and rules, alerts and actions, one /metrics and the
users' answers out. service.py composes it; each subpackage is one concern (README.md, Layout)."""
