"""Command-line interface: builds config objects and hands them to the agent and the collector."""
