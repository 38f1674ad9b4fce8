"""`run` and `demo` from a non-editable install (`pip install .`, as the README says), started from the
root of the clone: the clone's `clusterwatch/` folder must not shadow the installed package in the
processes they start (`python -m` puts the working directory first on sys.path).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.support.helpers import ROOT

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv with clusterwatch installed from a copy of this tree (not editable); its `clusterwatch` script.

    Offline: its dependencies (pip too) come from this interpreter's site-packages through a .pth, which
    adds those folders to sys.path without running the .pth files in it (the editable install's among them).
    """
    tmp = tmp_path_factory.mktemp("installed")
    src = tmp / "src"  # a copy: building in place would leave build/ in the shared tree
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info",
                                                             "__pycache__", ".pytest_cache", ".hypothesis",
                                                             ".ruff_cache", "tests", "bench"))
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    deps = [p for p in sys.path if p.endswith("site-packages")]
    Path(purelib, "zz-deps.pth").write_text("".join(f"{p}\n" for p in deps))
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--no-index", str(src)], capture_output=True, text=True, timeout=600, cwd=tmp)
    assert r.returncode == 0, r.stderr[-3000:]
    where = subprocess.run([str(py), "-c", "import clusterwatch.cli.main as m; print(m.__file__)"],
                           capture_output=True, text=True, cwd=tmp, timeout=60)
    assert where.stdout.startswith(str(env_dir)), where.stdout + where.stderr
    return env_dir / "bin" / "clusterwatch"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLUSTERWATCH_", "PYTHON"))}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def test_run_from_the_clones_root_with_a_non_editable_install(installed):
    r = subprocess.run([str(installed), "run", "--interval", "0.5", "--gpu-source", "none", "--",
                        "sh", "-c", "sleep 2; exit 3"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env=_env())
    assert "No module named" not in r.stderr, r.stderr
    assert r.returncode == 3, r.stderr
    assert "clusterwatch · job local-" in r.stderr


def test_demo_from_the_clones_root_with_a_non_editable_install(installed):
    r = subprocess.run([str(installed), "demo", "--duration", "6", "--interval", "0.5", "--refresh", "2"],
                       capture_output=True, text=True, cwd=ROOT, timeout=180, env=_env())
    assert "No module named" not in r.stderr + r.stdout, r.stderr
    assert r.returncode == 0, r.stderr
    # the closing summary's heading (demo_cmd.py, since f22982e)
    assert "The job's summary as stored when it ended" in r.stdout and "demo-node2" in r.stdout
