"""scripts/setup.sh on a fresh Debian 12 (issue 26): it installs Python 3 and venv itself, and pins everything it
installs with pip (dependencies, dev tools, pip and setuptools) to requirements/dev.txt, the versions this
environment has, so that a release after them cannot break a fresh clone."""
from __future__ import annotations

import re
from importlib import metadata

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from tests.support.helpers import ROOT

LOCK = ROOT / "requirements" / "dev.txt"


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins() -> dict[str, str]:
    lines = [x.strip() for x in LOCK.read_text().splitlines() if x.strip() and not x.startswith("#")]
    bad = [x for x in lines if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!-]+", x)]
    assert bad == [], f"not NAME==VERSION: {bad}"
    return {_normal(x.split("==")[0]): x.split("==")[1] for x in lines}


def _wanted() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = set()
    for spec in [*project["dependencies"], *project["optional-dependencies"]["dev"]]:
        requirement, _, marker = spec.partition(";")
        if "python_version < '3.11'" in marker:
            continue  # tomli: not installed on the 3.11 the lock is made with
        names.add(_normal(re.split(r"[<>=!~ \[]", requirement.strip(), maxsplit=1)[0]))
    return names


def test_every_dependency_and_dev_tool_is_pinned_with_pip_and_setuptools():
    missing = (_wanted() | {"pip", "setuptools"}) - set(_pins())
    assert not missing, f"requirements/dev.txt does not pin {sorted(missing)}: install them and make it again"


def test_the_pins_are_the_versions_installed_here():
    differ = {name: (version, metadata.version(name)) for name, version in _pins().items()
              if metadata.version(name) != version}
    assert not differ, f"(pinned, installed) differ: {differ}; make requirements/dev.txt again (its header says how)"


def test_setup_installs_python_itself_and_only_what_the_lock_pins():
    script = (ROOT / "scripts" / "setup.sh").read_text()
    debs = script.split("DEBS=(", 1)[1].split(")", 1)[0].split()
    assert {"python3", "python3-venv"} <= set(debs)
    pips = [x.strip() for x in script.splitlines() if "-m pip install" in x]
    assert pips == ['.venv/bin/python -m pip install -q --constraint "$LOCK" pip',
                    '.venv/bin/python -m pip install -q --requirement "$LOCK"',
                    ".venv/bin/python -m pip install -q --no-deps --no-build-isolation -e ."]
    assert "LOCK=requirements/dev.txt" in script
