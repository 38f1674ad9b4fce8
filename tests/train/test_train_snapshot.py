# ruff: noqa: F811  (pytest fixtures imported from tests/support/train_agent.py are parameters here)
"""memory_snapshot: answered by clusterwatch.train itself in a process whose torch uses CUDA, into a file
no other user can read; asked by a socket playing the agent."""
from __future__ import annotations

import os
import pickle
import stat
import subprocess
import sys

import pytest

from clusterwatch import train
from clusterwatch import train_snapshot as ts
from tests.support.train_agent import agent, sock_dir  # noqa: F401  (fixtures)

RUN = r"""
import os, pickle, sys, time, types
from clusterwatch import train
if sys.argv[1] != "no-torch":
    cuda = types.ModuleType("torch.cuda")
    cuda.is_initialized = lambda: True
    cuda.current_device = lambda: 0
    cuda.device_count = lambda: 1
    cuda.memory_stats = lambda i: {}
    cuda.memory_allocated = cuda.memory_reserved = lambda i: 0
    memory = types.ModuleType("torch.cuda.memory")
    def _dump_snapshot(path):   # torch's writes a pickle of the allocator's state by name
        with open(path, "wb") as f:
            pickle.dump({"segments": [{"device": 0, "total_size": 2 << 20}], "device_traces": []}, f)
    memory._dump_snapshot = _dump_snapshot
    cuda.memory = memory
    torch = types.ModuleType("torch")
    torch.cuda = cuda
    sys.modules["torch"] = torch
if sys.argv[1] == "own-handler":
    train.on_request("memory_snapshot", lambda r: "the user's own")
print("ready", flush=True)
for step in range(100000):
    train.report(step=step)
    time.sleep(0.02)
"""


def ask_snapshot(agent, mode: str, env: dict) -> list[dict]:
    proc = subprocess.Popen([sys.executable, "-c", RUN, mode], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, train.SOCKET_ENV: agent.path, **env})
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        agent.first_report()
        agent.ask("memory_snapshot", "m1", agent.sender_pid)
        return agent.answers("m1")
    finally:
        proc.kill()
        proc.wait()


def test_a_snapshot_goes_into_a_private_file_and_the_answer_says_where(agent, tmp_path):
    folder = tmp_path / "snaps"
    got = ask_snapshot(agent, "torch", {ts.SNAPSHOT_DIR_ENV: str(folder)})
    assert [r["status"] for r in got] == ["accepted", "done"]
    message = got[-1]["message"]
    assert message.startswith(f"wrote {folder}/memory-snapshot-{agent.sender_pid}-")
    assert message.endswith(".pickle (mode 0600); open it in PyTorch's memory viewer, https://pytorch.org/memory_viz")
    path = message.split()[1]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    with open(path, "rb") as f:
        assert pickle.load(f)["segments"][0]["total_size"] == 2 << 20


def test_without_torch_the_snapshot_is_refused_with_the_reason(agent, tmp_path):
    got = ask_snapshot(agent, "no-torch", {ts.SNAPSHOT_DIR_ENV: str(tmp_path / "s")})
    assert got[-1]["status"] == "refused" and "no PyTorch using CUDA" in got[-1]["message"]
    assert not (tmp_path / "s").exists()


def test_the_user_s_own_handler_replaces_the_built_in_one(agent, tmp_path):
    got = ask_snapshot(agent, "own-handler", {ts.SNAPSHOT_DIR_ENV: str(tmp_path / "s")})
    assert (got[-1]["status"], got[-1]["message"]) == ("done", "the user's own")


def test_a_folder_others_can_read_or_swap_is_refused(tmp_path):
    open_folder = tmp_path / "open"
    open_folder.mkdir(mode=0o755)
    open_folder.chmod(0o755)
    with pytest.raises(ts.NoSnapshot, match=r"must be this user's and mode 0700 \(it is uid \d+, mode 0755\)"):
        ts.private_folder(str(open_folder))
    link = tmp_path / "link"
    link.symlink_to(open_folder)
    with pytest.raises(ts.NoSnapshot, match="is not a folder \\(a link\\?\\)"):
        ts.private_folder(str(link))
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(ts.NoSnapshot, match="it is uid 65534"):
        ts.private_folder(str(theirs))
    mine = ts.private_folder(str(tmp_path / "new"))
    assert stat.S_IMODE(os.stat(mine).st_mode) == 0o700
