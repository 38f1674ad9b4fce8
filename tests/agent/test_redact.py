"""agent/redact.py: credentials out of URLs, argv and the environment kept for provenance."""
from __future__ import annotations

import pytest
from clusterwatch.agent.redact import is_secret_name, redact_argv, select_env, strip_url_credentials

from tests.support.git_repos import TOKEN


@pytest.mark.parametrize("url, expected", [
    (f"https://user:{TOKEN}@github.com/o/r.git", "https://github.com/o/r.git"),
    (f"https://{TOKEN}:x-oauth-basic@github.com/o/r", "https://github.com/o/r"),
    (f"https://oauth2:{TOKEN}@gitlab.example.org:8443/g/r.git", "https://gitlab.example.org:8443/g/r.git"),
    ("https://us@er:p@ss@host/r", "https://host/r"),
    ("ssh://git@github.com/o/r.git", "ssh://github.com/o/r.git"),
    ("git@github.com:o/r.git", "git@github.com:o/r.git"),
    ("https://github.com/o/r.git", "https://github.com/o/r.git"),
    ("/srv/git/r.git", "/srv/git/r.git"),
    (f"fatal: unable to access 'https://u:{TOKEN}@h/r/': 403", "fatal: unable to access 'https://h/r/': 403"),
])
def test_strip_url_credentials(url, expected):
    assert strip_url_credentials(url) == expected


@pytest.mark.parametrize("name, secret", [
    ("HF_TOKEN", True), ("WANDB_API_KEY", True), ("AWS_SECRET_ACCESS_KEY", True), ("DB_PASSWORD", True),
    ("--api-key", True), ("--token", True), ("wandb.api_key", True), ("GITHUB_AUTH", True),
    ("SLURM_JOB_ID", False), ("RANK", False), ("MASTER_ADDR", False), ("--lr", False),
])
def test_is_secret_name(name, secret):
    assert is_secret_name(name) is secret


def test_redact_argv_keeps_positions_and_hides_values():
    argv = ["python", "train.py", "--token=abc", "--api-key", "xyz", "--lr", "0.1",
            "wandb.api_key=qqq", f"--repo=https://u:{TOKEN}@h/r", "--auth", "--verbose"]
    assert redact_argv(argv) == ("python", "train.py", "--token=<redacted>", "--api-key", "<redacted>",
                                 "--lr", "0.1", "wandb.api_key=<redacted>", "--repo=https://h/r",
                                 "--auth", "--verbose")


def test_select_env_keeps_what_matters_and_drops_secrets():
    environ = {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_ID": "42", "SLURM_NODELIST": "n[1-2]",
               "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "MASTER_ADDR": "n1", "MASTER_PORT": "29500",
               "HF_TOKEN": TOKEN, "SLURM_FAKE_SECRET": "s", "WANDB_API_KEY": "k", "WANDB_PROJECT": "p",
               "HOME": "/home/u", "MY_URL": f"https://u:{TOKEN}@h/x", "PATH": "/bin"}
    got = select_env(environ, extra=("WANDB_*", "MY_URL"))
    assert got == {"CUDA_VISIBLE_DEVICES": "0,1", "LOCAL_RANK": "1", "MASTER_ADDR": "n1",
                   "MASTER_PORT": "29500", "MY_URL": "https://h/x", "RANK": "1", "SLURM_JOB_ID": "42",
                   "SLURM_NODELIST": "n[1-2]", "WANDB_PROJECT": "p", "WORLD_SIZE": "8"}
