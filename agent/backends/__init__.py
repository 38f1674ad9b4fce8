"""Data sources of the agent, each behind a small protocol with a real and a simulated implementation."""
