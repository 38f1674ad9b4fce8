"""The suite run from the background (`bash scripts/test.sh &`, nohup): such a runner ignores SIGINT, SIGQUIT
and SIGHUP, and an ignored signal is inherited across exec, so the processes the tests start must not be."""
from __future__ import annotations

import signal
import subprocess
import sys

from tests.support.helpers import ROOT, clean_environ

CHILD = """
import signal, subprocess, sys

def test_a_child_sees_the_default_stop_signals():
    probe = "import signal; print([signal.getsignal(s) == signal.SIG_IGN for s in (2, 3, 1)])"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60).stdout
    assert out.strip() == "[False, False, False]", out
"""


def _ignore_stop_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


def test_tests_started_with_stop_signals_ignored_start_children_with_the_defaults(tmp_path):
    # the probe outside the source tree, run under the suite's configuration with its conftest as a plugin
    (tmp_path / "test_probe.py").write_text(CHILD)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT), "-p", "tests.conftest",
                        str(tmp_path / "test_probe.py")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env=clean_environ(),
                       preexec_fn=_ignore_stop_signals)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "1 passed" in r.stdout, r.stdout[-3000:]
