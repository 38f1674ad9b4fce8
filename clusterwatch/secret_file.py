"""A secret kept in a file only its owner may read: the agents' token, the web proxy's secret.

A secret others can read is no secret, and one others can change is theirs: the file must be a regular
file owned by this process's user or root, with no access for group or others, read through the
descriptor it was checked on.
"""
from __future__ import annotations

import os
import stat

from .errors import ConfigError

# A secret is one line of visible ASCII (it travels as a header or gRPC metadata); a file past this is not one.
MAX_BYTES = 4096


def read_secret_file(path: str, flag: str, what: str, min_chars: int = 1) -> bytes:
    """The secret on the first line of `path`.

    Args:
        path: the file.
        flag: how the message names the file (e.g. "token file /etc/clusterwatch/token").
        what: what the secret is, in the messages (e.g. "the agents' token").
        min_chars: the least length a secret may have.

    Raises:
        ConfigError: missing, not a regular file, owned by someone else, open to group or others, or no secret
            on its first line; one line that says what to do.
    """
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            text = f.read(MAX_BYTES) if stat.S_ISREG(st.st_mode) else b""
    except OSError as exc:
        raise ConfigError(f"{flag}: {exc.strerror}; give a file holding {what} "
                          "(openssl rand -hex 32 > FILE; chmod 600 FILE)") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{flag}: not a regular file; give a file holding {what}")
    if st.st_uid not in (os.geteuid(), 0):
        raise ConfigError(f"{flag}: owned by uid {st.st_uid}, who may change it; give it to root or to this "
                          "command's user")
    if st.st_mode & 0o077:
        raise ConfigError(f"{flag}: readable by others than its owner (mode {stat.S_IMODE(st.st_mode):04o}), who "
                          f"could use {what}; chmod 600 {path}")
    secret = text.split(b"\n", 1)[0].strip()
    if len(secret) < min_chars or not all(0x21 <= c < 0x7F for c in secret):
        least = f"at least {min_chars} " if min_chars > 1 else ""
        raise ConfigError(f"{flag}: its first line must be {what}, {least}visible ASCII characters without spaces "
                          "(openssl rand -hex 32 > FILE)")
    return secret
