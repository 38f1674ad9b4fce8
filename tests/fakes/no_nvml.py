"""A host without a usable NVML library, on any host: for the tests of what the agent says then.

A test that counts on "this machine has no NVIDIA driver" fails on a machine that has one. Instead the
code runs in a child process whose LD_LIBRARY_PATH starts with a folder holding a libnvidia-ml.so.1 that
cannot be loaded: the dynamic loader finds it first (LD_LIBRARY_PATH comes before the ld.so cache, where
a driver's library is), and since it needs a library that does not exist, dlopen fails there and does
not look further, as where no driver is installed; pynvml then raises NVMLError_LibraryNotFound.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.helpers import clean_environ

__all__ = ["unloadable_library", "run_without_nvml"]

LIBRARY = "libnvidia-ml.so.1"
_MISSING = "cw-absent"  # the library it needs, built to link against and then removed


def unloadable_library(dest: Path) -> Path:
    """Build a libnvidia-ml.so.1 that no process can load into `dest`; return the folder."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc) on PATH: run scripts/setup.sh, which installs gcc")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "absent.c").write_text("int cw_absent(void) { return 0; }\n")
    (dest / "nvml.c").write_text("extern int cw_absent(void);\nint cw_nvml_unloadable(void) { return cw_absent(); }\n")
    missing = dest / f"lib{_MISSING}.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(missing), str(dest / "absent.c")], check=True, timeout=60)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(dest / LIBRARY), str(dest / "nvml.c"), f"-L{dest}",
                    f"-l{_MISSING}", "-Wl,--no-as-needed"], check=True, timeout=60)
    missing.unlink()
    return dest


def run_without_nvml(code: str, tmp: Path, *, also_on_path: Path | None = None) -> subprocess.CompletedProcess:
    """Run Python `code` in a child that finds only the unloadable NVML library.

    Args:
        code: the program.
        tmp: a folder of the test's own for the library.
        also_on_path: a folder searched after it (a loadable library there is never reached).
    """
    path = [str(unloadable_library(tmp / "no-nvml"))] + ([str(also_on_path)] if also_on_path else [])
    env = clean_environ()
    env["LD_LIBRARY_PATH"] = os.pathsep.join(path + ([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else []))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
