"""The job page's action tokens outlive a collector restart (their key is kept beside the store, mode 0600),
stay bound to the user and the job, and expire.

End to end: a real collector with --web-actions, a real agent and a real trainer with a checkpoint handler;
(tests/support/trainers.py); the confirmation page is opened, the collector restarted on the same store, and the page's
"Yes" still works.
"""
from __future__ import annotations

import json
import os
import re
import stat
import urllib.error
import urllib.request
from urllib.parse import urlencode

import pytest
from clusterwatch.collector.state.store import web_token_secret
from clusterwatch.collector.web.actions import TOKEN_TTL_S, Tokens

from tests.support.helpers import Collector
from tests.support.trainers import start_trainer

JOB = "token-restart"


def _request(port: int, path: str, data: dict | None = None) -> tuple[int, str]:
    url = f"http://127.0.0.1:{port}{path}"
    req = urllib.request.Request(url, data=urlencode(data).encode() if data is not None else None,
                                 headers={"Origin": f"http://127.0.0.1:{port}"} if data is not None else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.e2e
def test_a_confirmation_page_opened_before_a_restart_works_after_it(tmp_path):
    db = tmp_path / "clusterwatch.db"
    # unauthenticated queries: the page's browser acts only where the collector opts in
    args = ("--web-listen", "127.0.0.1:0", "--web-actions", "--allow-unauthenticated-actions")
    first = Collector(tmp_path, *args, db=db)
    trainer = start_trainer(tmp_path, first.address, JOB)
    second = None
    try:
        trainer.stepping()
        code, page = _request(json.loads(first.ports_file.read_text())["web"], f"/jobs/{JOB}/confirm?action=checkpoint")
        assert code == 200, page
        token = re.search(r'name="token" value="([0-9a-f]+)"', page).group(1)

        first.stop()
        # the same gRPC port, for the agent to come back to; the pages wherever they land
        second = Collector(tmp_path, *args, db=db, name="collector2", listen=f"127.0.0.1:{first.grpc_port}")
        web = json.loads(second.ports_file.read_text())["web"]
        trainer.stepping()  # its agent is back: the job's process is live at the new collector
        code, page = _request(web, f"/jobs/{JOB}/act", {"action": "checkpoint", "token": token})
        assert code == 200 and "saved checkpoint at step" in page, page
        assert len(trainer.checkpoints()) == 1
        # still bound to the job: the same token does not do for another one (refused before any asking)
        code, page = _request(web, "/jobs/another-job/act", {"action": "checkpoint", "token": token})
        assert code != 200
    finally:
        trainer.stop()
        for c in (second, first):
            if c is not None:
                c.stop()
    key = db.parent / (db.name + ".web-secret")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.stat().st_uid == os.geteuid()


def test_the_key_is_made_once_mode_0600(tmp_path):
    db = str(tmp_path / "c.db")
    key = web_token_secret(db)
    assert len(key) == 32 and web_token_secret(db) == key
    assert stat.S_IMODE(os.stat(db + ".web-secret").st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["c.db.web-secret"]  # nothing left aside


def test_a_key_others_may_read_is_replaced(tmp_path):
    db = str(tmp_path / "c.db")
    key = web_token_secret(db)
    os.chmod(db + ".web-secret", 0o644)
    new = web_token_secret(db)
    assert new != key and len(new) == 32 and web_token_secret(db) == new
    assert stat.S_IMODE(os.stat(db + ".web-secret").st_mode) == 0o600


def test_a_link_in_the_keys_place_is_replaced_not_followed(tmp_path):
    db = str(tmp_path / "c.db")
    target = tmp_path / "elsewhere"
    target.write_bytes(b"k" * 32)
    os.chmod(target, 0o600)
    os.symlink(target, db + ".web-secret")
    key = web_token_secret(db)
    assert key != b"k" * 32 and not os.path.islink(db + ".web-secret")
    assert target.read_bytes() == b"k" * 32  # the link's target untouched


def test_a_short_key_is_replaced(tmp_path):
    db = str(tmp_path / "c.db")
    fd = os.open(db + ".web-secret", os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"short")
    os.close(fd)
    key = web_token_secret(db)
    assert len(key) == 32 and web_token_secret(db) == key


def test_a_store_in_memory_has_a_key_of_its_run():
    assert web_token_secret(":memory:") != web_token_secret(":memory:")


def test_a_token_is_bound_to_the_user_and_the_job_and_expires():
    now = [1_800_000_000.0]
    tokens = Tokens(b"s" * 32, clock=lambda: now[0])
    token = tokens.make("alice", "42")
    assert tokens.refusal(token, "alice", "42") == ""
    assert "not this page's" in tokens.refusal(token, "bob", "42")
    assert "not this page's" in tokens.refusal(token, "alice", "43")
    assert "not this page's" in tokens.refusal("", "alice", "42")
    assert "not this page's" in tokens.refusal("zz" + token[2:], "alice", "42")
    # its time cannot be moved on: it is under the HMAC
    later = f"{int(now[0]) + 3600:08x}" + token[8:]
    assert "not this page's" in tokens.refusal(later, "alice", "42")
    # the same key after a restart (a new Tokens) takes it
    assert Tokens(b"s" * 32, clock=lambda: now[0]).refusal(token, "alice", "42") == ""
    now[0] += TOKEN_TTL_S + 1
    assert "hours old" in tokens.refusal(token, "alice", "42")
