"""Alerts and the actions they take: the live rules loop, the alert table, webhooks, asks to training."""
