"""What every process of the test suite gets in place of the caller's settings (tests/conftest.py applies it).

- No CLUSTERWATCH_* variable of the caller (a token, a collector, a store, a config file).
- CLUSTERWATCH_CONFIG naming an empty file: the config loader falls back to /etc/clusterwatch/config.toml
  when the variable is unset (clusterwatch/config.py), and a site config there (a token, a collector)
  would decide tests; a test that wants a config passes its own --config or CLUSTERWATCH_CONFIG.
- CLUSTERWATCH_KMSG=none: an agent reads /dev/kmsg by default, and a host whose kernel log holds the
  driver's XID lines would give the tests' simulated GPUs health events; a test of the kernel log passes
  its own --kmsg file.
- No proxy variable: grpc takes grpc_proxy, https_proxy and http_proxy for its channels, and urllib (the
  tests' /metrics reads) http_proxy even for 127.0.0.1, unless no_proxy says otherwise; the tests' servers
  are all on loopback, reached directly.

tests/support/helpers.py's clean_environ() keeps the SUITE_SETTINGS variables, so every child the tests start
inherits them.
"""
from __future__ import annotations

import os

SUITE_SETTINGS = {"CLUSTERWATCH_CONFIG": os.devnull, "CLUSTERWATCH_KMSG": "none"}

PROXY_VARIABLES = tuple(name for base in ("http_proxy", "https_proxy", "grpc_proxy", "all_proxy", "ftp_proxy",
                                          "no_proxy") for name in (base, base.upper()))


def callers_settings(environ) -> list[str]:
    """The variables of `environ` the suite takes away: CLUSTERWATCH_* and the proxies."""
    return [n for n in environ if n.startswith("CLUSTERWATCH_") or n in PROXY_VARIABLES]
