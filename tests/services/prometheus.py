"""A real Prometheus (Debian's `prometheus` package) on a free loopback port, for integration tests.

It scrapes the given targets every second (the default here; clusterwatch ships 15 s) into a
temporary storage folder, can load rule files, and is stopped by its PID when the fixture ends.
Use it as a pytest fixture::

    from tests.services.prometheus import prometheus_factory  # noqa: F401  (registers the fixture)

    @pytest.mark.prometheus
    def test_x(prometheus_factory):
        prom = prometheus_factory(["127.0.0.1:9750"], rule_files=[Path("deploy/prometheus/alerts.yml")])
        prom.wait_for_series("clusterwatch_node_up")
        assert prom.query("clusterwatch_node_up")

or as a context manager: ``with running_prometheus(tmp, targets) as prom: ...``.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.waiting import poll_until
from tests.services.procs import free_port, require_binary, stop_pid, wait_http_ready

#: Bound on /-/ready (seen at 0.2 s on these machines).
READY_TIMEOUT_S = 20.0
#: Bound on one HTTP request to the API.
HTTP_TIMEOUT_S = 10.0


class PromQueryError(AssertionError):
    """Prometheus answered a query with an error (a parse error, a bad function argument...)."""


@dataclass
class Prometheus:
    """A running Prometheus.

    Attributes:
        root: folder with prometheus.yml, the TSDB (data/) and prometheus.log.
        port: the HTTP port on 127.0.0.1.
        popen: the process (stopped by its PID).
    """

    root: Path
    port: int
    popen: subprocess.Popen

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log(self) -> str:
        """The tail of Prometheus's log, for assertion messages."""
        try:
            return "\n".join((self.root / "prometheus.log").read_text(errors="replace").splitlines()[-30:])
        except OSError:
            return ""

    def api(self, path: str, **params: str | Sequence[str]) -> object:
        """GET /api/v1/<path> and return its `data`; raise PromQueryError with Prometheus's message on an error."""
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=HTTP_TIMEOUT_S) as r:
                doc = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            # A query that does not parse comes back as 400 with a JSON body that says why.
            body = exc.read().decode(errors="replace")
            try:
                doc = json.loads(body)
            except ValueError:
                raise PromQueryError(f"{path} {params}: HTTP {exc.code}: {body[:300]}") from None
        if doc.get("status") != "success":
            raise PromQueryError(f"{params.get('query', path)!s}: {doc.get('errorType')}: {doc.get('error')}")
        return doc["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query; returns the result list (vectors) or a one-item list (a scalar)."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def label_values(self, label: str, match: str) -> list[str]:
        """What Grafana's label_values(match, label) lists."""
        return self.api(f"label/{label}/values", **{"match[]": match})

    def wait_for_series(self, expr: str, count: int = 1, timeout: float = 60.0) -> list[dict]:
        """Wait until `expr` returns at least `count` series; return them."""
        seen: list[dict] = []

        def enough() -> bool:
            nonlocal seen
            seen = self.query(expr)
            return len(seen) >= count

        if not poll_until(enough, timeout, interval=0.5):
            raise AssertionError(f"{expr} returned {len(seen)} series, not {count}, within {timeout:.0f} s; "
                                 f"Prometheus log:\n{self.log()}")
        return seen

    def stop(self) -> None:
        stop_pid(self.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)  # reap it: no zombie left behind


def _config(targets: Sequence[str], rule_files: Sequence[Path], scrape_interval: str) -> str:
    # Prometheus reads YAML, and JSON is YAML: no YAML library needed to write it.
    doc = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "rule_files": [str(Path(p).resolve()) for p in rule_files],
        "scrape_configs": [{
            "job_name": "clusterwatch",
            # As in deploy/prometheus/prometheus.yml: the collector's labels win over target labels.
            "honor_labels": True,
            "static_configs": [{"targets": list(targets)}],
        }],
    }
    return json.dumps(doc, indent=2)


@contextlib.contextmanager
def running_prometheus(root: Path, targets: Sequence[str], rule_files: Sequence[Path] = (),
                       scrape_interval: str = "1s", config_text: str | None = None) -> Iterator[Prometheus]:
    """Start Prometheus in `root` scraping `targets`; stop it by its PID when the block ends.

    `config_text`: a whole prometheus.yml instead (a shipped one, its paths made the test's).
    """
    binary = require_binary("prometheus", "prometheus")
    root.mkdir(parents=True, exist_ok=True)
    conf = root / "prometheus.yml"
    conf.write_text(config_text if config_text is not None else _config(targets, rule_files, scrape_interval))
    port = free_port()
    with open(root / "prometheus.log", "ab") as log:
        popen = subprocess.Popen(
            [binary, f"--config.file={conf}", f"--web.listen-address=127.0.0.1:{port}",
             f"--storage.tsdb.path={root / 'data'}",
             # Not used by the API, but Debian's defaults point at /etc and /usr/share.
             f"--web.console.templates={root}", f"--web.console.libraries={root}"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=root,
        )
    prom = Prometheus(root=root, port=port, popen=popen)
    try:
        wait_http_ready(popen, f"{prom.url}/-/ready", "prometheus", prom.log, READY_TIMEOUT_S)
        yield prom
    finally:
        prom.stop()


@pytest.fixture(scope="module")
def prometheus_factory(tmp_path_factory: pytest.TempPathFactory):
    """A function (targets, rule_files=(), scrape_interval="1s") -> Prometheus; all stopped at teardown.

    Module-scoped, so a module can share one Prometheus (and the data it scraped) between tests.
    """
    tmp_path = tmp_path_factory.mktemp("prometheus")
    stack = contextlib.ExitStack()
    count = 0

    def start(targets: Sequence[str], rule_files: Sequence[Path] = (), scrape_interval: str = "1s") -> Prometheus:
        nonlocal count
        count += 1
        return stack.enter_context(running_prometheus(tmp_path / f"prometheus-{count}", targets, rule_files,
                                                      scrape_interval))

    with stack:
        yield start
