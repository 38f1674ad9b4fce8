"""Fakes shaped like the libraries the agent talks to (pynvml), for tests."""
