"""`clusterwatch demo` prints its job's page, and the page answers while the demo runs."""
from __future__ import annotations

import re
import subprocess
import urllib.error
import urllib.request

import pytest

from tests.support.helpers import CLI, clean_environ, wait_for

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


SYSTEM_PYTHON = "/usr/bin/python3"  # one that `nobody` may run (the venv's may sit in a folder it may not enter)
FETCH = r"""
import sys, urllib.error, urllib.request
try:
    r = urllib.request.urlopen(sys.argv[1], timeout=20)
except urllib.error.HTTPError as exc:
    r = exc
print(r.status if hasattr(r, "status") else r.code, r.read().decode())
"""


def _fetch_as(user: str, url: str) -> tuple[int, str]:
    """GET `url` from a process of `user` (root may act as any user: the suite runs as root)."""
    import os

    assert os.geteuid() == 0, "this test starts a process as another user: run the suite as root, as CI does"
    r = subprocess.run(["runuser", "-u", user, "--", SYSTEM_PYTHON, "-c", FETCH, url], capture_output=True,
                       text=True, timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    code, _, body = r.stdout.partition(" ")
    return int(code), body


def test_the_demos_page_and_its_actions_are_its_users_alone(tmp_path):
    """Every user of the host reaches loopback: the demo's page (with Stop) answers only its own user's
    connections, as `run`'s does (--web-owner-uid)."""
    proc = subprocess.Popen([*CLI, "demo", "--duration", "20", "--interval", "0.5", "--refresh", "5",
                             "--keep", str(tmp_path / "demo")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=clean_environ())
    try:
        url = None
        for line in proc.stdout:
            found = re.search(r"The job's page: (http://127\.0\.0\.1:\d+/jobs/\S+)", line)
            if found:
                url = found.group(1)
                break
        assert url, proc.stderr.read()
        wait_for(lambda: (page := _page(url)) and 'id="action-stop"' in page, timeout=30,
                 what="the job's page with its actions")
        job_id = url.rsplit("/", 1)[1]
        for path in ("", "/confirm?action=stop"):
            code, body = _fetch_as("nobody", url + path)
            assert code == 403 and "another user of this host" in body and job_id not in body, (path, body[:500])
        code, body = _fetch_as("root", url)
        assert code == 200 and 'id="action-stop"' in body
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
