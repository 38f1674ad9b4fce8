"""Grouping ranks by stack: py-spy dump's output shapes (text and --json, --locals, --native,
--subprocesses, old hex thread ids, errors) and clusterwatch.train's own dump_stacks answer."""
from __future__ import annotations

import json
import threading

import pytest

from clusterwatch import stacks
from clusterwatch.stacks import Frame, Group
from clusterwatch.train_requests import format_stacks

HUNG = """\
Process 4242: /usr/bin/python3 train.py --lr 3e-4
Python v3.11.4 (/usr/bin/python3.11)

Thread 4242 (active+gil): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:2050)
    wrapper (torch/distributed/c10d_logger.py:72)
    train_step (train.py:212)
    main (train.py:290)
    <module> (train.py:301)
Thread 4301 (idle): "pin_memory"
    wait (threading.py:324)
    get (queue.py:180)
    _pin_memory_loop (torch/utils/data/_utils/pin_memory.py:54)
    run (threading.py:982)
    _bootstrap_inner (threading.py:1045)
    _bootstrap (threading.py:1002)
"""

LOADER = """\
Process 4260: /usr/bin/python3 train.py --lr 3e-4
Python v3.11.4 (/usr/bin/python3.11)

Thread 4260 (idle): "MainThread"
    poll (multiprocessing/popen_fork.py:27)
    _try_get_data (torch/utils/data/dataloader.py:1133)
    _next_data (torch/utils/data/dataloader.py:1295)
    __next__ (torch/utils/data/dataloader.py:631)
    train_epoch (train.py:180)
    main (train.py:288)
    <module> (train.py:301)
"""

LOCALS = """\
Process 977: python -m trainer.run
Python v3.10.12 (/usr/bin/python3.10)

Thread 977 (active): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:1536)
        Arguments:
            tensor: <Tensor at 0x7f5e2c1d4f40>
            op: <RedOpType at 0x7f5e2c1d4f80>
        Locals:
            work: None
    step (trainer/loop.py:88)
        Arguments:
            self: <Loop at 0x7f5e2c0f1a90>
    <module> (trainer/run.py:12)
"""

NATIVE = """\
Process 5120: python train.py
Python v3.12.1 (/opt/conda/bin/python3.12)

Thread 5120 (idle): "MainThread"
    __futex_abstimed_wait_common (libc.so.6)
    pthread_cond_wait@@GLIBC_2.3.2 (libc.so.6)
    c10d::ProcessGroupNCCL::WorkNCCL::synchronizeInternal (libtorch_cuda.so)
    barrier (torch/distributed/distributed_c10d.py:3685)
    setup (/home/alice/proj/train.py:41)
    <module> (/home/alice/proj/train.py:99)
"""

OLD = """\
Process 3131: python3 train.py
Python v3.8.10 (/usr/bin/python3.8)

Thread 0x7F4C8D53F740 (idle): "MainThread"
    select (selectors.py:415)
    serve_forever (socketserver.py:232)
    run_server (tools/serve.py:20)
Thread 0x7F4C7B3FE700 (active)
    spin (tools/serve.py:9)
"""

SUBPROCESSES = HUNG + """
--------------------------------------------------------------------------------
Process 4400: /usr/bin/python3 -c from multiprocessing.spawn import spawn_main
Python v3.11.4 (/usr/bin/python3.11)
Parent Process 4242: /usr/bin/python3 train.py --lr 3e-4

Thread 4400 (idle): "MainThread"
    _worker_loop (torch/utils/data/_utils/worker.py:265)
"""

JSON = json.dumps([  # `py-spy dump --json`: the list in py-spy's own order (the text reverses it)
    {"pid": 88, "thread_id": 139, "thread_name": "Thread-1", "os_thread_id": 91, "active": False,
     "owns_gil": False, "frames": [{"name": "wait", "filename": "/usr/lib/python3.11/threading.py",
                                    "short_filename": "threading.py", "line": 324, "locals": None,
                                    "module": None, "is_entry": True}]},
    {"pid": 88, "thread_id": 140, "thread_name": "MainThread", "os_thread_id": 88, "active": True,
     "owns_gil": True, "frames": [
         {"name": "all_reduce", "filename": "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py",
          "short_filename": "torch/distributed/distributed_c10d.py", "line": 2050},
         {"name": "train_step", "filename": "/home/u/train.py", "short_filename": "train.py", "line": 212}]},
])


@pytest.mark.parametrize("text, pid, main, place", [
    (HUNG, 4242, ("4242", "active+gil", "MainThread", 5), "all_reduce at train.py:212"),
    (LOADER, 4260, ("4260", "idle", "MainThread", 7), "__next__ at train.py:180"),
    (LOCALS, 977, ("977", "active", "MainThread", 3), "all_reduce at trainer/loop.py:88"),
    (NATIVE, 5120, ("5120", "idle", "MainThread", 6), "barrier at /home/alice/proj/train.py:41"),
    (OLD, 3131, ("0x7F4C8D53F740", "idle", "MainThread", 3), "serve_forever at tools/serve.py:20"),
    (SUBPROCESSES, 4242, ("4242", "active+gil", "MainThread", 5), "all_reduce at train.py:212"),
    (JSON, 88, ("88", "active+gil", "MainThread", 2), "all_reduce at train.py:212"),
], ids=["hung collective", "data loader", "--locals", "--native", "old hex ids", "--subprocesses", "--json"])
def test_py_spy_output_shapes(text, pid, main, place):
    dump = stacks.parse_dump(text)
    assert dump.pid == pid and dump.error == ""
    thread = stacks.main_thread(dump)
    assert thread is not None
    assert (thread.ident, thread.status, thread.name, len(thread.frames)) == main
    assert stacks.place(thread.frames) == place


def test_frames_are_read_whole():
    dump = stacks.parse_dump(HUNG)
    assert [t.name for t in dump.threads] == ["MainThread", "pin_memory"]
    assert dump.threads[0].frames[:2] == (Frame("all_reduce", "torch/distributed/distributed_c10d.py", 2050),
                                          Frame("wrapper", "torch/distributed/c10d_logger.py", 72))
    assert (dump.command, dump.python) == ("/usr/bin/python3 train.py --lr 3e-4", "3.11.4")
    native = stacks.parse_dump(NATIVE).threads[0].frames
    assert native[0] == Frame("__futex_abstimed_wait_common", "libc.so.6", None)
    assert str(native[0]) == "__futex_abstimed_wait_common (libc.so.6)" and str(native[4]).endswith("train.py:41)")
    old = stacks.parse_dump(OLD).threads[1]
    assert (old.ident, old.status, old.name) == ("0x7F4C7B3FE700", "active", "")
    assert len(stacks.parse_dump(SUBPROCESSES).threads) == 2  # the child process is not this rank's


@pytest.mark.parametrize("text, error", [
    ("Error: Failed to find python version from target process\n", "Error: Failed to find python version"),
    ("Permission Denied: Try running again with elevated permissions by going 'sudo env \"PATH=$PATH\" !!'\n",
     "Permission Denied: Try running again"),
    ("Error: No such file or directory (os error 2)\n", "Error: No such file or directory (os error 2)"),
    ("", "empty output"),
    ("[1, 2", "not py-spy's JSON"),
    ("[]", "no threads in py-spy's JSON"),
])
def test_a_dump_without_stacks_says_why(text, error):
    dump = stacks.parse_dump(text)
    assert dump.threads == () and dump.error.startswith(error)


def test_a_job_s_ranks_are_grouped_by_their_main_thread():
    dumps = {r: HUNG.replace("4242", str(5000 + r)) for r in range(64)}
    dumps[17] = LOADER
    dumps[40] = "Error: Failed to find python version from target process\n"
    dumps[41] = dumps[40]
    groups = stacks.group_ranks(dumps)
    assert [(len(g.ranks), g.place) for g in groups] == [
        (61, "all_reduce at train.py:212"), (1, "__next__ at train.py:180"),
        (2, "no stacks: Error: Failed to find python version from target process")]
    assert stacks.summarize(dumps) == [
        "61 ranks in all_reduce at train.py:212",
        "rank 17 in __next__ at train.py:180",
        "ranks 40-41: no stacks: Error: Failed to find python version from target process",
    ]
    assert groups[0].frames[0].name == "all_reduce" and 17 not in groups[0].ranks


def test_the_same_function_at_another_line_is_another_group():
    other = HUNG.replace("train_step (train.py:212)", "train_step (train.py:230)")
    groups = stacks.group_ranks({0: HUNG, 1: other, 2: HUNG})
    assert [g.summary() for g in groups] == ["ranks 0,2 in all_reduce at train.py:212",
                                             "rank 1 in all_reduce at train.py:230"]


@pytest.mark.parametrize("ranks, text", [
    ([3], "rank 3"), ([0, 1, 2, 3, 7], "ranks 0-3,7"), ([5, 1, 3], "ranks 1,3,5"), (range(9), "9 ranks"),
])
def test_rank_list(ranks, text):
    assert stacks.rank_list(ranks) == text


@pytest.mark.parametrize("frame, library", [
    (Frame("wait", "threading.py", 324), True),
    (Frame("f", "torch/nn/modules/module.py", 1), True),
    (Frame("f", "/usr/lib/python3.11/queue.py", 1), True),
    (Frame("f", "/opt/venv/lib/python3.11/site-packages/mylib/x.py", 1), True),
    (Frame("f", "<frozen importlib._bootstrap>", 1), True),
    (Frame("f", "libc.so.6"), True),
    (Frame("f", "train.py", 1), False),
    (Frame("f", "models/gpt.py", 1), False),
    (Frame("f", "/home/alice/proj/train.py", 1), False),
])
def test_what_counts_as_the_user_s_code(frame, library):
    assert stacks.is_library(frame) is library


def test_clusterwatch_train_s_own_dump_groups_like_py_spy_s():
    stuck = threading.Event()
    ready = threading.Event()

    def blocked_in_collective():
        ready.set()
        stuck.wait(30)

    t = threading.Thread(target=blocked_in_collective, name="MainThread-standin")
    t.start()
    try:
        ready.wait(5)
        dump = stacks.parse_dump(format_stacks())
    finally:
        stuck.set()
        t.join()
    standin = next(th for th in dump.threads if th.name == "MainThread-standin")
    user = next(f for f in standin.frames if f.name == "blocked_in_collective")
    assert user.file.endswith("test_stacks.py")
    # the library call the user's frame made (Event.wait), at the user's line
    assert stacks.place(standin.frames) == f"wait at {user.file}:{user.line}", standin.frames
    assert stacks.main_thread(dump).name == "MainThread"
    assert isinstance(stacks.group_ranks({0: dump})[0], Group)
