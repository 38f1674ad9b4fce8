"""The report's layout: it fits the terminal (80 columns at least), cuts say so, times carry their zone."""
from __future__ import annotations

import json
import time

import pytest
from clusterwatch.v1 import query_pb2

from clusterwatch.report import render
from clusterwatch.report.code import describe_code
from clusterwatch.report.text import fit
from tests.support.helpers import cli

from .test_cli_streams import running_job  # noqa: F401  (a fixture: a real run's job and collector)

LONG_NODE = "gpu-node-in-a-very-long-rack-name-017"
ALERT = ("Host memory (RSS) of rank 3 (pid 6949 on demo-node2, job demo-6913) grows 22.0 GiB/h for 1 min; "
         "node memory full in ~1 h 6 min")


def busy_view() -> query_pb2.JobView:
    v = query_pb2.JobView(now=1000.0)
    v.job.job_id, v.job.name, v.job.state, v.job.start_time = "4242", "train", "RUNNING", 400.0
    v.job.nodes.append(LONG_NODE)
    v.nodes.add(node=LONG_NODE, agent_up=True)
    v.gpus.add(node=LONG_NODE, index=0, name="NVIDIA H100 80GB HBM3 SXM5 (MIG 3g.40gb)", utilization=50.0,
               utilization_trend=[50.0] * 40, memory_used_bytes=20 << 30, memory_total_bytes=80 << 30,
               memory_peak_bytes=21 << 30, power_watts=600, processes=1)
    v.processes.add(node=LONG_NODE, pid=123456, command="python-train-script", alive=True, rank=0,
                    rss_bytes=1 << 30, rss_trend=[1.0, 2.0] * 20, gpu_memory_trend=[1.0, 2.0] * 20,
                    gpu_memory_bytes=20 << 30, gpu_memory_peak_bytes=21 << 30, step=100, steps_per_s=5.0,
                    cpu_percent=100, gpu_utilization=90)
    v.alerts.add(rule="host_memory_leak", state="firing", description=ALERT)
    return v


@pytest.mark.parametrize("width", [80, 100, 132])
def test_the_report_fits_the_width_it_is_given(width):
    text = render(busy_view(), width=width)
    lines = text.splitlines()
    assert max(len(x) for x in lines) <= width, [x for x in lines if len(x) > width]
    rules = {len(x) for x in lines if x and set(x) <= {"─", "═"}}
    assert len(rules) == 1 and rules.pop() <= width
    assert "rank 3 (pid 6949" in text.replace("\n", " ")  # the alert wraps, all of it is there
    if width == 80:
        assert "python-tr…" in text and "NVIDIA H100 80GB HBM3…" in text  # cut, and saying so


def test_without_a_width_nothing_is_dropped_and_rules_span_the_tables():
    text = render(busy_view(), width=None)
    lines = text.splitlines()
    rule = max(len(x) for x in lines if x and set(x) <= {"─"})
    tables = [x for x in lines if x.startswith("   RANK") or x.startswith("  NODE")]
    assert rule == max(len(x) for x in tables) and rule > 80
    assert ALERT in text and "PEAK" in text and "TREND" in text


def test_fit_marks_a_cut():
    assert fit("short", 10) == "short"
    assert fit("much-too-long", 8) == "much-to…"


def test_start_time_carries_its_zone():
    text = render(busy_view(), width=None)
    zone = time.strftime("%Z", time.localtime(400.0))
    (line,) = [x for x in text.splitlines() if "Start time:" in x]
    assert line.endswith(zone)


def test_the_code_line_shows_the_checkout_then_the_remote():
    record = {"git": {"root": "/home/alice/model", "commit": "0123456789abcdef", "branch": "main", "dirty": False,
                      "remote_url": "git@example.org:team/model.git"}}
    assert describe_code(record) == ("/home/alice/model @ 0123456789ab (main), clean; "
                                     "remote git@example.org:team/model.git")
    record["git"]["remote_url"] = ""
    assert describe_code(record) == "/home/alice/model @ 0123456789ab (main), clean"
    v = busy_view()
    v.provenance_json = json.dumps([dict(record, node=LONG_NODE, pid=123456, code_id="c")])
    assert "  /home/alice/model @ 0123456789ab (main), clean" in render(v, width=None)


@pytest.mark.e2e
def test_status_fits_columns_from_the_environment(running_job):  # noqa: F811
    job, address = running_job
    r = cli("status", job, "--collector", address, env={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    assert max(len(x) for x in r.stdout.splitlines()) <= 80


def stalled_view() -> query_pb2.JobView:
    """A busy job at its widest: the allocator's figures, a stalled rank held in D, a rank gone, loss and lr,
    long names, a long command, an answer and notes."""
    v = busy_view()
    v.job.nodes.extend([f"{LONG_NODE}-{n}" for n in range(8)])
    v.job.note = "announced by the prolog; " * 6
    v.tags["experiment"] = "a-very-long-experiment-name-" * 4
    p = v.processes[0]
    p.gpu_allocated_bytes, p.gpu_reserved_bytes, p.loss, p.lr = 18 << 30, 19 << 30, 0.123456789, 3e-4
    v.processes.add(node=LONG_NODE, pid=123457, command="python-train-script", alive=True, rank=1, step=40,
                    steps_per_s=0.0, stalled_since=700.0, loss=2.5, lr=3e-4, state="D", state_since=800.0,
                    wchan="nfs_wait_bit_killable_with_a_long_name", gpu_allocated_bytes=1 << 30)
    v.processes.add(node=LONG_NODE, pid=123458, command="python-train-script", alive=False, rank=2, step=7)
    v.provenance_json = json.dumps([{"node": LONG_NODE, "pid": 123456, "code_id": "c",
                                     "cmdline": ["python", "train.py", *(["--option=value"] * 20)],
                                     "git": {"root": "/home/alice/" + "deep/" * 20 + "model", "commit": "0" * 40,
                                             "branch": "main", "dirty": False,
                                             "remote_url": "git@example.org:team/model.git"}}])
    v.train_answers.add(node=LONG_NODE, pid=123457, rank=1, kind="checkpoint", status="done", asked_at=990.0,
                        answered_at=995.0, asked_by="alice", message="saved to /scratch/alice/" + "x" * 120)
    return v


def test_every_line_fits_80_columns_with_stalled_and_long_rows():
    text = render(stalled_view(), width=80)
    lines = text.splitlines()
    assert max(len(x) for x in lines) <= 80, [x for x in lines if len(x) > 80]
    assert "stalled since" in text and "uninterruptible sleep (D)" in text and "gone" in text


def test_a_report_into_a_pipe_fits_80_columns(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)  # pytest's stdout is no terminal
    lines = render(stalled_view()).splitlines()
    assert max(len(x) for x in lines) <= 80, [x for x in lines if len(x) > 80]


def test_loss_and_lr_are_shown_where_reported():
    text = render(stalled_view(), width=80)
    training = text.split("\nTraining (by rank, as reported)\n", 1)[1]
    header, *rows = [x for x in training.splitlines()[1:] if x.strip()][:3]
    assert header.split() == ["RANK", "NODE", "PID", "STEP", "STEP/S", "LOSS", "LR"]
    assert rows[0].split()[-2:] == ["0.1235", "0.0003"]
    assert rows[1].split()[-2:] == ["2.5", "0.0003"]


def test_the_gpu_table_shows_sm_activity_beside_utilisation_where_read_within_80_columns():
    v = busy_view()
    v.gpus[0].utilization = 100.0
    v.gpus[0].activity.window_s, v.gpus[0].activity.sm_active = 10.0, 2.0  # a collective spinning
    v.gpus.add(node=LONG_NODE, index=1, name="NVIDIA A100-SXM4-80GB", utilization=100.0, processes=1)  # no GPM
    for width in (80, None):
        text = render(v, width=width)
        lines = text.split("\nGPUs\n", 1)[1].splitlines()
        header = next(x for x in lines if x.startswith("  NODE"))
        assert header.split()[3:5] == ["UTIL", "SM"], header
        rows = [x for x in lines if LONG_NODE[:5] in x]
        assert [r.split()[r.split().index("100%") + 1] for r in rows] == ["2%", "-"], rows
        assert "SM: the share of its SMs at work (NVML GPM)" in text
        if width == 80:
            assert max(len(x) for x in text.splitlines()) <= 80
    # no GPU with GPM: the table as it always was
    plain = render(busy_view(), width=80).split("\nGPUs\n", 1)[1]
    assert " SM " not in plain.splitlines()[1] and "NVML GPM" not in plain


def test_the_jobs_tmpfs_files_count_in_host_memory_and_their_line_fits_80_columns():
    v = busy_view()
    v.job.memory_bytes = 8 << 30
    v.nodes[0].tmpfs_bytes = 3 << 30
    v.nodes[0].tmpfs_shared_with.extend(["4243", "4250"])
    text = render(v, width=80)
    assert max(len(x) for x in text.splitlines()) <= 80
    flat = " ".join(text.split())
    assert "4.0 GiB of 8.0 GiB allocated" in flat  # 1 GiB of RSS and 3 GiB of files
    assert "Shared memory 3.0 GiB in /dev/shm and tmpfs files of the job's user (in host memory)" in flat
    assert "jobs 4243, 4250 on the same node hold them too" in flat
    v.nodes[0].ClearField("tmpfs_bytes")  # an older agent: no walk, no line
    assert "Shared memory" not in render(v, width=80)


def test_a_root_jobs_tmpfs_is_said_not_counted_in_80_columns():
    v = busy_view()
    v.job.user = "root"  # the collector gives no tmpfs figure for root's jobs (collector/state/tmpfs.py)
    text = render(v, width=80)
    assert max(len(x) for x in text.splitlines()) <= 80
    assert "/dev/shm and tmpfs files not counted for root's jobs (the machine's)" in " ".join(text.split())
    v.job.user = "alice"  # another user's job before a walk: nothing said
    assert "Shared memory" not in render(v, width=80)
    v.job.user, v.job.end_time = "root", 1000.0  # an ended job: its tmpfs is not shown at all
    assert "Shared memory" not in render(v, width=80)
