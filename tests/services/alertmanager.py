"""A real Alertmanager (Debian's `prometheus-alertmanager` package) on a loopback port, for integration tests.

It keeps its silences and notification log in a temporary folder, gossips with nobody
(--cluster.listen-address empty), routes every alert to a receiver that sends nothing, and is stopped
by its PID when the block ends. Use it as a context manager::

    with running_alertmanager(tmp_path / "am") as am:
        notifier = AlertmanagerNotifier([am.url + "/api/v2/alerts"])
        ...
        assert am.wait_for_alerts(alertname="gpu_memory_leak")

or through the `alertmanager_factory` fixture (import it into the test module).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.waiting import poll_until
from tests.services.procs import free_port, log_tail, require_binary, stop_child, wait_http_ready

#: Bound on /-/ready (seen well under a second on these machines).
READY_TIMEOUT_S = 20.0
#: Bound on one HTTP request to the API.
HTTP_TIMEOUT_S = 10.0

# JSON is YAML: every alert to one receiver that notifies nobody; group_wait short, though nothing is sent
_CONFIG = {"route": {"receiver": "nobody", "group_wait": "1s", "group_interval": "1s"},
           "receivers": [{"name": "nobody"}]}


@dataclass
class Alertmanager:
    """A running Alertmanager.

    Attributes:
        root: folder with alertmanager.yml, its storage (data/) and alertmanager.log.
        port: the HTTP port on 127.0.0.1.
        popen: the process (stopped by its PID).
    """

    root: Path
    port: int
    popen: subprocess.Popen

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        """The tail of Alertmanager's log, for assertion messages."""
        return log_tail(self.root / "alertmanager.log")

    def alerts(self, **label_values: str) -> list[dict]:
        """GET /api/v2/alerts (active, silenced and inhibited alerts; resolved ones are not listed), those with
        these label values."""
        query = urllib.parse.urlencode([("filter", f'{name}="{value}"') for name, value in label_values.items()])
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts?{query}", timeout=HTTP_TIMEOUT_S) as r:
            return json.loads(r.read())

    def wait_for_alerts(self, until: Callable[[list[dict]], bool] = bool, timeout: float = 30.0,
                        **label_values: str) -> list[dict]:
        """Poll alerts(**label_values) until `until` holds for them (default: there are some); return them."""
        seen: list[dict] = []

        def done() -> bool:
            nonlocal seen
            seen = self.alerts(**label_values)
            return until(seen)

        if not poll_until(done, timeout, interval=0.2):
            raise AssertionError(f"Alertmanager's alerts {label_values} did not come to the expected state within "
                                 f"{timeout:.0f} s: {seen}\nAlertmanager log:\n{self.log()}")
        return seen

    def silence(self, minutes: float = 60, **label_values: str) -> str:
        """Create a silence matching these label values exactly, through the API; returns its id."""
        now = datetime.datetime.now(datetime.timezone.utc)
        doc = {"matchers": [{"name": n, "value": v, "isRegex": False, "isEqual": True}
                            for n, v in label_values.items()],
               "startsAt": now.isoformat(), "endsAt": (now + datetime.timedelta(minutes=minutes)).isoformat(),
               "createdBy": "clusterwatch tests", "comment": "a test's silence"}
        req = urllib.request.Request(f"{self.url}/api/v2/silences", data=json.dumps(doc).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as r:
            return json.loads(r.read())["silenceID"]

    def stop(self) -> None:
        stop_child(self.popen)


@contextlib.contextmanager
def running_alertmanager(root: Path, port: int | None = None) -> Iterator[Alertmanager]:
    """Start Alertmanager in `root` on 127.0.0.1:`port` (None: a free one); stop it by its PID when the block
    ends. The same root again keeps its silences (a restart)."""
    binary = require_binary("prometheus-alertmanager", "prometheus-alertmanager")
    root.mkdir(parents=True, exist_ok=True)
    conf = root / "alertmanager.yml"
    conf.write_text(json.dumps(_CONFIG, indent=2))
    port = port or free_port()
    with open(root / "alertmanager.log", "ab") as log:
        popen = subprocess.Popen(
            [binary, f"--config.file={conf}", f"--storage.path={root / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=root,
        )
    am = Alertmanager(root=root, port=port, popen=popen)
    try:
        wait_http_ready(popen, f"{am.url}/-/ready", "alertmanager", am.log, READY_TIMEOUT_S)
        yield am
    finally:
        am.stop()


@pytest.fixture
def alertmanager_factory(tmp_path: Path):
    """A function (port=None) -> Alertmanager; each started in a folder of its own, all stopped at teardown."""
    stack = contextlib.ExitStack()
    count = 0

    def start(port: int | None = None) -> Alertmanager:
        nonlocal count
        count += 1
        return stack.enter_context(running_alertmanager(tmp_path / f"alertmanager-{count}", port))

    with stack:
        yield start
