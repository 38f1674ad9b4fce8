"""A real VictoriaMetrics (Debian's `victoria-metrics` package) on a free loopback port, for integration tests.

Single-node: it takes Prometheus's remote write at /api/v1/write and answers the Prometheus query API
(/api/v1/query) from a temporary storage folder; stopped by its PID when the block ends::

    with running_victoriametrics(tmp_path / "vm") as vm:
        ...  # Prometheus remote_write to vm.write_url
        vm.query('count(clusterwatch_node_up)')
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.services.procs import free_port, require_binary, stop_pid, wait_http_ready

#: Bound on /health answering (seen at well under a second here).
READY_TIMEOUT_S = 20.0
HTTP_TIMEOUT_S = 10.0


@dataclass
class VictoriaMetrics:
    root: Path
    port: int
    popen: subprocess.Popen

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def write_url(self) -> str:
        """Where Prometheus's remote_write sends."""
        return f"{self.url}/api/v1/write"

    def log(self) -> str:
        try:
            return "\n".join((self.root / "victoria-metrics.log").read_text(errors="replace").splitlines()[-30:])
        except OSError:
            return ""

    def query(self, expr: str) -> list[dict]:
        """An instant query through the Prometheus-compatible API; its result list."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        try:
            with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as r:
                doc = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{expr}: HTTP {exc.code}: {exc.read()[:300]!r}") from None
        if doc.get("status") != "success":
            raise AssertionError(f"{expr}: {doc}")
        return doc["data"]["result"]

    def stop(self) -> None:
        stop_pid(self.popen.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)


@contextlib.contextmanager
def running_victoriametrics(root: Path) -> Iterator[VictoriaMetrics]:
    """Start victoria-metrics in `root` on a free loopback port; stop it by its PID when the block ends."""
    binary = require_binary("victoria-metrics", "victoria-metrics")
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with open(root / "victoria-metrics.log", "ab") as log:
        popen = subprocess.Popen(
            [binary, f"-storageDataPath={root / 'data'}", f"-httpListenAddr=127.0.0.1:{port}",
             "-retentionPeriod=1d",
             # By default an instant query leaves out the last 30 s (samples still in flight from many
             # Prometheus shards); a test on one host asks for what was just written.
             "-search.latencyOffset=1s", "-search.disableCache"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=root,
        )
    vm = VictoriaMetrics(root=root, port=port, popen=popen)
    try:
        wait_http_ready(popen, f"{vm.url}/health", "victoria-metrics", vm.log, READY_TIMEOUT_S)
        yield vm
    finally:
        vm.stop()
