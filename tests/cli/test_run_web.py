"""`clusterwatch run --web-listen`: the job's page of a run, opt-in, on loopback only, read-only unless asked.

Real `clusterwatch run` processes watching a real command; the page fetched over loopback as a browser would.
"""
from __future__ import annotations

import html
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from tests.support.helpers import CLI, clean_environ, cli, wait_for

pytestmark = pytest.mark.e2e

PAGE_LINE = re.compile(r"\[clusterwatch\] the job's page: (http://127\.0\.0\.1:(\d+)/jobs/local-(\d+)) ")


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.read().decode()
    except urllib.error.HTTPError:
        return None  # 404 until the agent's first samples name the job


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
    assert os.geteuid() == 0, "this test starts a process as another user: run the suite as root, as CI does"
    r = subprocess.run(["runuser", "-u", user, "--", SYSTEM_PYTHON, "-c", FETCH, url], capture_output=True,
                       text=True, timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    code, _, body = r.stdout.partition(" ")
    return int(code), body


def _watched_page(tmp_path, *flags: str, env: dict | None = None, meanwhile=None) -> tuple[str, str, int]:
    """Run a command that waits for a file under `run --web-listen 127.0.0.1:0 FLAGS`; its page (once it
    shows the command's process), the printed line and the command's pid. `meanwhile(url)` is called while
    the run still runs. The run is ended and reaped."""
    done = tmp_path / "done"
    code = f"import os, time\nwhile not os.path.exists({str(done)!r}): time.sleep(0.1)"
    proc = subprocess.Popen([*CLI, "run", "--interval", "0.5", "--gpu-source", "none", "--status-every", "0",
                             "--web-listen", "127.0.0.1:0", *flags, "--", sys.executable, "-c", code],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env or clean_environ())
    try:
        found = None
        for line in proc.stderr:  # printed at start, before the command's first sample is in
            found = PAGE_LINE.search(line)
            if found:
                break
        assert found, f"no page line; run exited {proc.poll()}"
        url, pid = found.group(1), int(found.group(3))

        def shows_the_process():
            page = _get(url)
            report = re.search(r'<pre id="status">(.*?)</pre>', page or "", re.S)
            return page if report and re.search(rf"\b{pid}\b", html.unescape(report.group(1))) else None

        page = wait_for(shows_the_process, timeout=60, what="the job's page with the command's process")
        if meanwhile is not None:
            meanwhile(url)
        done.touch()
        proc.communicate(timeout=90)
        assert proc.returncode == 0
        return page, found.string, pid
    finally:
        done.touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_printed_address_serves_the_jobs_page_read_only(tmp_path):
    # a CLUSTERWATCH_WEB_ACTIONS meant for the cluster's collector must not give a run's page its buttons
    env = clean_environ() | {"CLUSTERWATCH_WEB_ACTIONS": "1"}
    page, line, pid = _watched_page(tmp_path, env=env)
    assert f"Job local-{pid}" in page and 'id="badge"' in page and "<svg" in page
    assert "id=\"action-" not in page, "a run's page is read-only without --web-actions"
    assert "(read-only; for your own browser only)" in line


def test_web_actions_offer_the_buttons_to_the_user_alone(tmp_path):
    seen = {}

    def as_others(url: str) -> None:
        # every user of the host reaches loopback: the kernel's socket table says whose connection it is
        seen["nobody"] = _fetch_as("nobody", url)
        seen["nobody-stop"] = _fetch_as("nobody", url + "/confirm?action=stop")
        seen["root"] = _fetch_as("root", url)

    page, line, pid = _watched_page(tmp_path, "--web-actions", meanwhile=as_others)
    assert 'id="action-diagnose"' in page and 'id="action-stop"' in page
    assert "with Diagnose, Request checkpoint and Stop" in line
    for key in ("nobody", "nobody-stop"):
        code, body = seen[key]
        assert code == 403 and "another user of this host" in body and f"local-{pid}" not in body, (key, body)
    assert seen["root"][0] == 200 and 'id="action-stop"' in seen["root"][1]


@pytest.mark.parametrize("address", ["0.0.0.0:0", "[::]:8080", "192.0.2.7:9752", "example.org:80"])
def test_an_address_off_loopback_is_refused_in_one_line(address):
    r = cli("run", "--web-listen", address, "--", sys.executable, "-c", "pass", timeout=30)
    assert r.returncode == 2 and "loopback only" in r.stderr and "ssh -L" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "watching" not in r.stderr


def test_web_actions_without_a_page_is_refused_in_one_line():
    r = cli("run", "--web-actions", "--", sys.executable, "-c", "pass", timeout=30)
    assert r.returncode == 2 and "--web-listen" in r.stderr and "Traceback" not in r.stderr, r.stderr
