"""`clusterwatch demo` prints its job's page, and the page answers while the demo runs."""
from __future__ import annotations

import re
import subprocess
import urllib.error
import urllib.request

import pytest

from tests.helpers import CLI, clean_environ, wait_for

pytestmark = pytest.mark.e2e


def _page(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.read().decode()
    except urllib.error.HTTPError:
        return None


def test_the_demo_prints_its_job_page_and_serves_it(tmp_path):
    proc = subprocess.Popen([*CLI, "demo", "--duration", "20", "--interval", "0.5", "--refresh", "5",
                             "--keep", str(tmp_path / "demo")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=clean_environ())
    try:
        url = None
        for line in proc.stdout:  # the line comes before the first report
            found = re.search(r"The job's page: (http://127\.0\.0\.1:\d+/jobs/\S+)", line)
            if found:
                url = found.group(1)
                break
        assert url, proc.stderr.read()
        # 404 until an agent reports the job, then its page, whose charts and nodes come with the first
        # samples: waited for whole, since on a loaded machine the page answered once before they came
        wait_for(lambda: (page := _page(url)) and 'id="badge"' in page and "<svg" in page and "demo-node1" in page,
                 timeout=30, what="the job's page with its badge, charts and node")
        # the demo's page is the user's own, on loopback, without query authentication: it offers the actions
        page = _page(url)
        assert 'id="action-diagnose"' in page and 'id="action-stop"' in page, page[:2000]
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
