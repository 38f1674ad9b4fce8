"""Progress from a job's output: the built-in patterns on generated tqdm, Trainer and Lightning output, the tail
reader's bounds, and the site regex's time limit (agent/job_output_parse.py, _tail.py, _regex.py)."""
from __future__ import annotations

import os
import re

import pytest
from clusterwatch.agent.job_output_parse import Progress, ProgressTracker, parse_line
from clusterwatch.agent.job_output_regex import SiteRegex, check_pattern
from clusterwatch.agent.job_output_tail import OutputTail

from clusterwatch.errors import ConfigError
from tests.support.progress_output import hf_trainer, lightning, tqdm_bar, tqdm_run


def follow(text: str) -> Progress | None:
    """What a tracker makes of `text` as one file (split where the tail splits it)."""
    tracker = ProgressTracker()
    for line in re.split(r"[\r\n]", text):
        p = parse_line(line)
        if p is not None:
            tracker.feed(p)
    return tracker.take()


@pytest.mark.parametrize("line, step, total, loss", [
    ("  45%|████▌     | 450/1000 [00:10<00:12, 44.1it/s]", 450, 1000, None),
    (tqdm_bar(7, 10, ascii_bar=True), 7, 10, None),
    (tqdm_bar(3, 40, "train", postfix="loss=0.25, lr=1e-4"), 3, 40, 0.25),
    ("450it [00:10, 44.1it/s]", 450, None, None),
    ("Epoch 0:  45%|████▌ | 450/1000 [00:10<00:12, 44.1it/s, v_num=0, loss=0.452]", 450, 1000, 0.452),
])
def test_bars(line, step, total, loss):
    p = parse_line(line)
    assert p is not None and (p.step, p.total, p.loss) == (step, total, loss)


def test_trainer_log_line():
    p = parse_line("{'loss': 0.4521, 'grad_norm': 1.23, 'learning_rate': 4.5e-05, 'epoch': 0.3}")
    assert (p.step, p.loss, p.lr, p.epoch) == (None, 0.4521, 4.5e-05, 0.3)
    assert parse_line("{'eval_loss': 0.5, 'eval_runtime': 1.2}") is None


@pytest.mark.parametrize("line", ["hello", "", "loss: 0.3", "12%", "{}", "1.2k/3.4k [00:01<00:02]",
                                  "nan%|x| 1/2 [", "\x00\xff" * 50])
def test_other_lines_say_nothing(line):
    assert parse_line(line) is None


def test_trainer_output_keeps_the_training_bar_through_evaluation():
    p = follow(hf_trainer(max_steps=60, log_every=20, eval_steps=30, eval_batches=8))
    assert (p.step, p.loss, p.epoch) == (60, pytest.approx(1 / 60, abs=1e-4), 1.0)


def test_trainer_mid_evaluation_shows_the_step_it_paused_at():
    text = hf_trainer(max_steps=60, eval_steps=30, eval_batches=8)
    cut = text.index("\r" + tqdm_bar(4, 8))  # inside the first evaluation
    assert follow(text[:cut]).step == 30


def test_lightning_step_rises_across_epochs_and_ignores_validation():
    p = follow(lightning(epochs=3, batches=20, val_batches=5))
    assert (p.step, p.epoch, p.loss) == (2 * 20 + 20, 2.0, pytest.approx(1 / 61, abs=1e-3))


def test_a_plain_bar_started_again_keeps_rising():
    p = follow(tqdm_run(10) + tqdm_run(10) + tqdm_run(10, close=False)[:-0 or None])
    assert p.step == 30


def test_take_gives_a_change_once():
    t = ProgressTracker()
    assert t.take() is None
    t.feed(parse_line(tqdm_bar(1, 10)))
    assert t.take().step == 1
    t.feed(parse_line(tqdm_bar(1, 10)))
    assert t.take() is None


def test_a_printed_step_wins_over_bars():
    t = ProgressTracker()
    t.feed(Progress(step=500, explicit=True))
    t.feed(parse_line(tqdm_bar(3, 10)))
    assert t.take().step == 500


# -- the tail --------------------------------------------------------------------------------------


@pytest.fixture
def out(tmp_path):
    path = tmp_path / "slurm-1.out"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)
    yield path
    os.close(fd)


def _tail(path, **kw) -> OutputTail:
    return OutputTail(os.open(path, os.O_RDONLY), **kw)


def test_tail_reads_carriage_return_updates_and_the_bar_being_written(out):
    tail = _tail(out)
    with open(out, "a") as f:
        f.write("starting\n\r" + tqdm_bar(1, 10) + "\r" + tqdm_bar(2, 10))
    lines, pending = tail.read()
    assert lines == ["starting", tqdm_bar(1, 10)] and pending == tqdm_bar(2, 10)
    with open(out, "a") as f:
        f.write("\r" + tqdm_bar(3, 10))
    lines, pending = tail.read()
    assert lines == [tqdm_bar(2, 10)] and pending == tqdm_bar(3, 10)


def test_tail_starts_near_the_end_and_skips_what_it_cannot_keep_up_with(out):
    out.write_bytes(b"old line\n" * 100_000)
    tail = _tail(out, max_read=4096)
    lines, _ = tail.read()
    assert lines and len(lines) <= 4096 // 9 and all(line == "old line" for line in lines)
    with open(out, "ab") as f:
        f.write(b"x" * 100_000 + b"\nnewest\n")
    lines, _ = tail.read()
    assert lines == ["newest"] and tail.skipped_bytes > 0


def test_tail_drops_a_huge_line_without_newline(out):
    tail = _tail(out, max_line=100)
    with open(out, "ab") as f:
        f.write(b"y" * 50_000)
    assert tail.read() == ([], "")
    with open(out, "ab") as f:
        f.write(b"y" * 50_000 + b"\nafter\n")
    assert tail.read() == (["after"], "")


def test_tail_survives_binary_garbage(out):
    tail = _tail(out)
    with open(out, "ab") as f:
        f.write(os.urandom(20_000) + b"\n" + tqdm_bar(5, 10).encode() + b"\n")
    lines, _ = tail.read()
    assert parse_line(lines[-1]).step == 5
    assert all(isinstance(line, str) for line in lines)


def test_tail_reads_a_truncated_file_from_its_start(out):
    tail = _tail(out)
    out.write_text("a\n" * 1000)
    tail.read()
    out.write_text("")
    with open(out, "a") as f:
        f.write("again\n")
    assert tail.read() == (["again"], "") and tail.truncations == 1


def test_tail_gives_at_most_max_lines_the_newest(out):
    tail = _tail(out, max_lines=3)
    out.write_text("".join(f"{i}\n" for i in range(100)))
    assert tail.read() == (["97", "98", "99"], "")


# -- the site regex ----------------------------------------------------------------------------------


def test_site_regex_reads_its_groups():
    site = SiteRegex(r"iter (?P<step>\d+) loss (?P<loss>[0-9.]+) lr (?P<lr>[0-9.e-]+)")
    try:
        got = site(["iter 12 loss 0.5 lr 1e-4", "nothing", "iter 99999999999999999999999 loss 1 lr 1"])
        assert got[0] == Progress(step=12, loss=0.5, lr=1e-4, explicit=True)
        assert got[1] is None
        assert got[2] == Progress(step=None, loss=1.0, lr=1.0)  # a step past int64 is no step
    finally:
        site.close()


@pytest.mark.parametrize("pattern", ["(", "no groups here", r"(?P<other>\d+)"])
def test_site_regex_refused_at_start(pattern):
    with pytest.raises(ConfigError):
        check_pattern(pattern)


def test_a_line_that_backtracks_cannot_hold_the_agent():
    site = SiteRegex(r"^(?P<step>\d+)(\d+)+x$", timeout_s=0.3)
    hostile = ["1" * 5000]  # no x: exponential backtracking
    try:
        for _ in range(3):
            assert site(hostile) == [None]
        assert site.off and site.timeouts == 3
        assert site(["12x"]) == [None]  # off: not run any more
    finally:
        site.close()
