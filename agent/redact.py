"""Keep credentials out of provenance records: URLs, environment variables, command lines.

Pure functions from text to text. The rules lean towards removing too much: a
provenance record is copied into checkpoints, model cards and a cluster-wide
Prometheus, so a value that merely looks secret is not worth keeping.
"""
from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping

REDACTED = "<redacted>"

# Upper-cased substrings that make a variable or option name look secret.
SECRET_MARKERS: tuple[str, ...] = (
    "TOKEN", "SECRET", "PASSW", "PASSPHRASE", "KEY", "CREDENTIAL", "AUTH", "COOKIE",
    "PRIVATE", "SESSION", "SIGNATURE", "CERT",
)

# The variables that matter to a run, before any configured extras.
DEFAULT_ENV: tuple[str, ...] = (
    "CUDA_VISIBLE_DEVICES", "SLURM_*", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
    "NODE_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
)

MAX_VALUE_CHARS = 4096

# scheme://userinfo@host...: the userinfo is everything after "//" up to the last "@"
# before the first "/" (RFC 3986 netloc), which may itself contain ":" and "@".
_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<netloc>[^/\s'\"]*)")


def is_secret_name(name: str) -> bool:
    """Whether a variable or option name looks like it holds a secret.

    Args:
        name: e.g. "HF_TOKEN", "--api-key", "wandb.api_key".

    Returns:
        True for names containing TOKEN, KEY, SECRET, PASSWORD, AUTH, COOKIE...
    """
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def strip_url_credentials(text: str) -> str:
    """Remove the userinfo (user, password, token) from every URL in a text.

    `https://user:token@host/p` becomes `https://host/p`; `ssh://git@host/p` becomes
    `ssh://host/p`; scp-style `git@host:path` has no scheme and stays as it is (the
    part before "@" there is a login name, never a password).

    Args:
        text: a URL, or any text that may contain URLs (an error message).

    Returns:
        The text with each URL's userinfo removed.
    """
    if "://" not in text:
        return text

    def _strip(m: re.Match[str]) -> str:
        netloc = m.group("netloc")
        return m.group("scheme") + netloc.rpartition("@")[2]

    return _URL.sub(_strip, text)


def _clean_value(value: str) -> str:
    return strip_url_credentials(value[:MAX_VALUE_CHARS])


def select_env(environ: Mapping[str, str], extra: Iterable[str] = ()) -> dict[str, str]:
    """The variables of a process's environment that matter to a run, secrets dropped.

    Args:
        environ: the process's environment.
        extra: more names or shell-style globs ("WANDB_*") to keep.

    Returns:
        Name → value, sorted by name. A name that looks secret is dropped whatever
        pattern asked for it; URLs in values lose their credentials; values are
        cut to 4096 characters.
    """
    patterns = tuple(DEFAULT_ENV) + tuple(extra)
    out: dict[str, str] = {}
    for name in sorted(environ):
        if is_secret_name(name):
            continue
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            out[name] = _clean_value(environ[name])
    return out


def redact_argv(argv: Iterable[str]) -> tuple[str, ...]:
    """A command line with the values of secret-looking options replaced.

    Positions are kept (the command must stay readable): `--token=abc` becomes
    `--token=<redacted>`, `--api-key abc` becomes `--api-key <redacted>`, a
    Hydra-style `wandb.api_key=abc` becomes `wandb.api_key=<redacted>`, and URLs lose
    their credentials.

    Args:
        argv: the command line.

    Returns:
        The redacted command line.
    """
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next and not arg.startswith("-"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        name, eq, _value = arg.partition("=")
        if eq and name and " " not in name and is_secret_name(name):
            out.append(f"{name}={REDACTED}")
        elif arg.startswith("-") and len(arg) > 1 and not eq and is_secret_name(arg):
            out.append(arg)
            hide_next = True
        else:
            out.append(strip_url_credentials(arg))
    return tuple(out)
