"""The distribution: generated code up to date, a wheel that installs and runs, layering kept."""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.support.helpers import ROOT


def test_generated_code_matches_the_proto_files(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gen_proto
    finally:
        sys.path.pop(0)
    for fresh in gen_proto.generate(tmp_path):
        committed = ROOT / "proto" / "clusterwatch" / "v1" / fresh.name
        assert committed.exists(), f"{committed} missing: run python scripts/gen_proto.py"
        assert committed.read_text() == fresh.read_text(), (
            f"{committed.name} is out of date with the .proto files: run python scripts/gen_proto.py")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("folder,forbidden", [
    ("agent", "clusterwatch.collector"), ("collector", "clusterwatch.agent"),
    ("clusterwatch", "clusterwatch.agent"), ("clusterwatch", "clusterwatch.collector"),
    # the commands sit on top: what the collector's pages and the agent share with them is in clusterwatch/
    ("agent", "clusterwatch.cli"), ("collector", "clusterwatch.cli"), ("clusterwatch", "clusterwatch.cli"),
])
def test_layering(folder, forbidden):
    offenders = [
        str(p.relative_to(ROOT)) for p in (ROOT / folder).rglob("*.py")
        if any(n == forbidden or n.startswith(forbidden + ".") for n in _imports(p))
    ]
    assert not offenders, f"{folder} must not import {forbidden} (README.md, Layout): {offenders}"


def test_train_module_needs_only_the_standard_library():
    path = ROOT / "clusterwatch" / "train.py"
    stdlib = sys.stdlib_module_names
    third_party = {n.split(".")[0] for n in _imports(path)} - set(stdlib) - {"clusterwatch"}
    assert not third_party, f"clusterwatch.train imports {third_party}"


def test_wheel_installs_into_a_fresh_venv_and_runs(tmp_path):
    dist = tmp_path / "dist"
    # from a copy: built in place, setuptools writes build/ and rewrites clusterwatch.egg-info in the shared
    # tree (which the editable install reads), and a stale build/lib could go into the wheel
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info",
                                                             "__pycache__", ".pytest_cache", ".hypothesis",
                                                             ".ruff_cache", "tests", "bench"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist),
                    str(src)], check=True, capture_output=True, timeout=300)
    wheels = list(dist.glob("clusterwatch-*.whl"))
    assert len(wheels) == 1
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheels[0])], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    # from outside the source tree, so nothing is imported from the checkout
    r = subprocess.run([str(env_dir / "bin" / "clusterwatch"), "--help"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    for command in ("agent", "collector", "status", "run", "demo"):
        assert command in r.stdout
    r = subprocess.run([str(py), "-c", "import clusterwatch.v1.agent_pb2, clusterwatch.agent.agent, "
                        "clusterwatch.collector.service, clusterwatch.cli.main; import os; "
                        "print(os.path.dirname(clusterwatch.v1.agent_pb2.__file__))"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    assert str(env_dir) in r.stdout
    top = {p.name for p in (env_dir / "lib").glob("python3*/site-packages/*")}
    assert not top & {"agent", "collector", "cli", "proto"}, "nothing but clusterwatch at the top level"


def test_editable_install_is_importable():
    r = subprocess.run([sys.executable, "-c", "import clusterwatch.collector.service, clusterwatch.v1.query_pb2"],
                       capture_output=True, text=True, cwd="/", timeout=60)
    assert r.returncode == 0, r.stderr
