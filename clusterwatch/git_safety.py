"""The one rule for asking git about a repository that may be hostile: what git is told so that nothing runs.

Used by the agent (agent/gitrun.py: git as the repository's owner, from outside the process) and by
training code itself (clusterwatch/train_provenance.py: git as the process's own user). A repository's
config can name programs git starts during `status`, `diff` or `log` (an fsmonitor hook, a pager, a filter
or diff driver, a credential helper, ssh); a checkout can be hostile (a shared directory, a clone with a
config written by someone else) or merely configured (git-lfs, an fsmonitor daemon). So each git call gets:

- a fresh environment (`safe_env`): nothing inherited; `HOME` and `XDG_CONFIG_HOME` pointing nowhere,
  `GIT_CONFIG_GLOBAL=/dev/null`, `GIT_CONFIG_NOSYSTEM=1`, `GIT_ATTR_NOSYSTEM=1` (only the repository's own
  config and attributes are read), `GIT_OPTIONAL_LOCKS=0` (no index written, so no post-index-change hook),
  no prompt and no askpass, `cat` as the pager, `LC_ALL=C`;
- command-scope settings (`SAFE_CONFIG`) that switch off every setting naming a program, and, for every
  filter and diff driver the repository's config defines, its commands emptied (`driver_overrides`). They
  travel in `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_n`/`GIT_CONFIG_VALUE_n` rather than `-c`: a subsection name
  may hold `=` (which `-c` splits on), and the environment reaches any git that git itself starts.

Standard library only: clusterwatch.train imports this into training processes.
"""
from __future__ import annotations

import os
from collections.abc import Iterable

__all__ = ["SAFE_CONFIG", "driver_overrides", "safe_env"]

# Each entry switches off one way a repository's config can make git run a program (or reach the network).
SAFE_CONFIG: tuple[tuple[str, str], ...] = (
    ("core.fsmonitor", "false"),            # a hook path here runs on every index refresh
    ("core.useBuiltinFSMonitor", "false"),  # the older spelling (Git for Windows)
    ("core.hooksPath", "/dev/null"),        # no hook can be found under a non-directory
    ("core.pager", "cat"),
    ("core.sshCommand", "false"),
    ("core.gitProxy", ""),
    ("core.askPass", ""),
    ("credential.helper", ""),              # an empty value resets the helper list
    ("diff.external", ""),
    ("diff.submodule", "short"),            # "diff" would run git diff inside each submodule
    ("status.submoduleSummary", "false"),   # would run `git submodule summary`, i.e. git log
    ("log.showSignature", "false"),         # would run gpg.program
    ("protocol.allow", "never"),            # no transport: no fetch, no remote helper, no ssh
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
)

# Driver settings that name a program, per driver kind, and what replaces them.
_DRIVER_KEYS: dict[str, tuple[tuple[str, str], ...]] = {
    "filter": (("clean", ""), ("smudge", ""), ("process", ""), ("required", "false")),
    "diff": (("textconv", ""), ("command", "")),
}


def driver_overrides(config_names: Iterable[str]) -> list[tuple[str, str]]:
    """The settings that empty every filter and diff driver a config defines.

    A `.gitattributes` line `* filter=x` makes `git status` and `git diff` run `filter.x.clean` (or
    `filter.x.process`) on file contents, and `diff=x` makes `git diff` run `diff.x.textconv`. Attributes
    are in the work tree, so instead of trusting them, every driver defined in config is emptied; a driver
    named in attributes but defined nowhere runs nothing.

    Args:
        config_names: variable names as `git config --list --name-only` prints them.

    Returns:
        (name, value) pairs to pass at command scope.
    """
    out: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for name in config_names:
        section, dot, rest = name.partition(".")
        section = section.lower()
        if not dot or section not in _DRIVER_KEYS:
            continue
        sub, dot, _key = rest.rpartition(".")
        if not dot or (section, sub) in seen:
            continue
        seen.add((section, sub))
        out.extend((f"{section}.{sub}.{key}", value) for key, value in _DRIVER_KEYS[section])
    return out


def safe_env(git: str, config: Iterable[tuple[str, str]] = ()) -> dict[str, str]:
    """A complete environment for one git call: nothing inherited, SAFE_CONFIG and `config` at command scope.

    Args:
        git: absolute path of the git binary (its directory goes on PATH).
        config: more command-scope settings (driver_overrides' output).
    """
    env = {
        "PATH": os.pathsep.join(dict.fromkeys([os.path.dirname(git), "/usr/bin", "/bin"])),
        "HOME": "/nonexistent",
        "XDG_CONFIG_HOME": "/nonexistent",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "",
        "SSH_ASKPASS": "",
        "GIT_PAGER": "cat",
        "PAGER": "cat",
        "GIT_PROTOCOL_FROM_USER": "0",
        "LC_ALL": "C",
        "LANG": "C",
    }
    pairs = list(SAFE_CONFIG) + list(config)
    env["GIT_CONFIG_COUNT"] = str(len(pairs))
    for i, (key, value) in enumerate(pairs):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env
