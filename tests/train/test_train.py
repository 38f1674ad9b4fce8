"""The training-progress channel: clusterwatch.train in real processes against a real TrainEndpoint."""
from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from clusterwatch.agent.provenance import process_start_time
from clusterwatch.agent.train_endpoint import TrainEndpoint, parse_datagram

from clusterwatch import train
from clusterwatch.errors import ConfigError
from clusterwatch.integrations._progress import HFReporter, LightningReporter

NOBODY = 65534

TRAINER = r"""
import json, os, sys, time
from clusterwatch import train
n, pace, run_s = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
train.tags(experiment="t1", dataset="toy")
worst = 0.0
windows = []   # iterations per 0.25 s window (run_s mode)
start = time.perf_counter()
i = 0
window_start, window_n = start, 0
while (i < n) if run_s == 0 else (time.perf_counter() - start < run_s):
    t = time.perf_counter()
    train.report(step=i, loss=1.0 / (i + 1), lr=0.1, tokens=float(i))
    worst = max(worst, time.perf_counter() - t)
    i += 1
    window_n += 1
    if t - window_start >= 0.25:
        windows.append(window_n)
        window_start, window_n = t, 0
    if pace:
        time.sleep(pace)
print(json.dumps({"pid": os.getpid(), "n": i, "sent": train.sent(), "dropped": train.dropped(),
                  "elapsed": time.perf_counter() - start, "worst": worst, "windows": windows}), flush=True)
sys.stdin.readline()   # stay alive until the test has checked the start time
"""


@pytest.fixture
def sock_dir():
    """A 0755 directory under /tmp (reachable by other users, unlike pytest's tmp_path)."""
    d = Path(tempfile.mkdtemp(prefix="cw-train-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def endpoint(sock_dir):
    ep = TrainEndpoint(str(sock_dir / "run" / "train.sock"))
    ep.start()
    yield ep
    ep.close()


def trainer(tmp_path: Path, sock: str, n: int = 0, pace: float = 0.0, run_s: float = 0.0) -> subprocess.Popen:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    env = {**os.environ, "CLUSTERWATCH_TRAIN_SOCKET": sock}
    return subprocess.Popen([sys.executable, str(script), str(n), str(pace), str(run_s)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def result(proc: subprocess.Popen) -> dict:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "the trainer died"
    return json.loads(line)


def finish(proc: subprocess.Popen) -> None:
    assert proc.stdin is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.wait(10) == 0


def wait_reports(ep: TrainEndpoint, count: int, timeout: float = 10.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += ep.drain()
        time.sleep(0.02)
    return got


def test_reports_arrive_with_the_kernel_given_identity(tmp_path, endpoint):
    sock_mode = stat.S_IMODE(os.stat(endpoint.path).st_mode)
    dir_mode = stat.S_IMODE(os.stat(os.path.dirname(endpoint.path)).st_mode)
    assert (sock_mode, dir_mode) == (0o666, 0o755)
    proc = trainer(tmp_path, endpoint.path, n=200, pace=0.002)
    res = result(proc)
    start = process_start_time(res["pid"])
    reports = wait_reports(endpoint, res["sent"])
    finish(proc)
    assert res["sent"] + res["dropped"] == 201  # 200 reports and the tags
    assert res["sent"] >= 150  # paced, so the kernel queue rarely fills, even on a busy machine
    assert len(reports) == res["sent"] and endpoint.rejected == 0
    assert {(r.pid, r.start_time) for r in reports} == {(res["pid"], start)}
    assert reports[0].tags == {"experiment": "t1", "dataset": "toy"} and reports[0].step is None
    steps = [r.step for r in reports[1:]]
    assert steps == sorted(steps) and steps[-1] <= 199 and len(set(steps)) == len(steps)
    last = reports[-1]
    assert last.loss == pytest.approx(1.0 / (last.step + 1)) and last.lr == 0.1
    assert last.metrics == {"tokens": float(last.step)}


@pytest.mark.serial  # times 20,001 sends (worst under 0.1 s, 200 µs each on average): load would stretch them
def test_without_an_agent_training_goes_on_and_counts_drops(tmp_path, sock_dir):
    proc = trainer(tmp_path, str(sock_dir / "absent.sock"), n=20000)
    res = result(proc)
    finish(proc)
    assert (res["sent"], res["dropped"]) == (0, 20001)
    # generous bounds: this is a shared, virtualised machine; the point is "no blocking"
    assert res["worst"] < 0.1
    assert res["elapsed"] / res["n"] < 200e-6


def test_agent_closed_mid_run_does_not_slow_training(tmp_path, endpoint):
    proc = trainer(tmp_path, endpoint.path, run_s=2.0)
    before = wait_reports(endpoint, 50)
    time.sleep(0.8)  # the trainer runs 2 s: close near the middle
    endpoint.close()
    res = result(proc)
    finish(proc)
    assert before and all(r.pid == res["pid"] for r in before)
    assert res["dropped"] > 0 and res["worst"] < 0.1
    windows = res["windows"]
    assert len(windows) >= 6
    early, late = windows[1:3], windows[-3:]
    # once the agent is gone a report costs less, not more
    assert min(late) >= 0.5 * (sum(early) / len(early)), windows


def test_malformed_datagrams_are_rejected_and_counted(endpoint):
    bad = [b"not json", b"[1, 2]", b'{"v": 2, "step": 1}', b'{"v": 1, "step": -1}',
           b'{"v": 1, "step": true}', b'{"v": 1, "loss": "x"}', b'{"v": 1, "loss": NaN}',
           b'{"v": 1, "m": {"a": "b"}}', b'{"v": 1, "tags": {"a": 1}}', b"\xff\xfe",
           b'{"v": 1, "step": 1, "pad": "' + b"x" * 5000 + b'"}']
    good = b'{"v": 1, "step": 7}'
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        for data in bad + [good]:
            s.sendto(data, endpoint.path)
            time.sleep(0.005)  # one at a time: the kernel queue is short
    reports = wait_reports(endpoint, 1)
    deadline = time.monotonic() + 5
    while endpoint.received < len(bad) + 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [r.step for r in reports] == [7]
    assert (endpoint.received, endpoint.rejected, endpoint.overflowed) == (len(bad) + 1, len(bad), 0)


def test_a_claimed_pid_is_ignored_and_users_cannot_forge_credentials(endpoint):
    code = (
        "import os, socket, struct, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)\n"
        f"path = {endpoint.path!r}\n"
        "s.sendto(b'{\"v\": 1, \"step\": 5, \"pid\": 1}', path)\n"
        "forged = [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, struct.pack('iII', 1, 0, 0))]\n"
        "try:\n"
        "    s.sendmsg([b'{\"v\": 1, \"step\": 6}'], forged, 0, path)\n"
        "    print(os.getpid(), 'forged', flush=True)\n"
        "except PermissionError:\n"
        "    print(os.getpid(), 'refused', flush=True)\n"
        "sys.stdin.read()  # alive until the test has its report\n"
    )
    sender = subprocess.Popen(["/usr/bin/python3", "-c", code], user=NOBODY, group=NOBODY, extra_groups=[],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        out = sender.stdout.readline().split()
        reports = wait_reports(endpoint, 1)
    finally:
        sender.communicate(timeout=30)
    time.sleep(0.1)
    reports += endpoint.drain()
    assert out[1] == "refused"  # the kernel refuses another pid/uid from a normal user
    assert [(r.pid, r.step) for r in reports] == [(int(out[0]), 5)]
    # the sender's identity, its start time with its pid, is read from /proc when its report arrives
    assert reports[0].start_time > 0


def test_invalid_values_are_left_out_not_raised(endpoint):
    before = train.invalid()
    os.environ["CLUSTERWATCH_TRAIN_SOCKET"] = endpoint.path
    try:
        train._state.sock = None  # pick up this test's socket path
        train._state.absent_until = 0.0
        ok = train.report(step=-1, loss=float("nan"), lr=float("inf"), epoch="x", good=2.5,  # type: ignore[arg-type]
                          bad=float("nan"), flag=True, **{"n" * 65: 1.0})
        assert ok is True
        assert train.invalid() - before == 7
        reports = wait_reports(endpoint, 1)
        assert len(reports) == 1 and reports[0].pid == os.getpid()
        r = reports[0]
        assert (r.step, r.loss, r.lr, r.epoch, r.metrics) == (None, None, None, None, {"good": 2.5})
    finally:
        del os.environ["CLUSTERWATCH_TRAIN_SOCKET"]
        train._state.sock = None


def test_text_the_agent_would_refuse_is_left_out_by_the_client(endpoint):
    before = train.invalid()
    os.environ["CLUSTERWATCH_TRAIN_SOCKET"] = endpoint.path
    try:
        train._state.sock = None
        train._state.absent_until = 0.0
        train._state.tags = {}
        assert train.tags(experiment="café", bad="\ud800", **{"\udfff": "x", "": "y"}) is True
        assert train.report(step=1, **{"\ud800": 1.0, "": 2.0, "µ": 3.0}) is True
        assert train.invalid() - before == 5
        reports = wait_reports(endpoint, 2)
        assert [(r.step, r.tags, r.metrics) for r in reports] == [
            (None, {"experiment": "café"}, {}), (1, {}, {"µ": 3.0})]
        assert endpoint.rejected == 0  # the agent saw nothing it had to drop
    finally:
        del os.environ["CLUSTERWATCH_TRAIN_SOCKET"]
        train._state.sock = None
        train._state.tags = {}
        train._state.tags_text = ""
        train._state.tags_due = float("inf")


def test_fork_gives_the_child_its_own_socket_and_counters(tmp_path, endpoint):
    code = r"""
import json, os, sys
from clusterwatch import train
train.tags(run="r1")
train.report(step=1)
parent_sock = train._state.sock  # kept referenced: a fresh object can never share its id
pid = os.fork()
if pid == 0:
    ok = train.report(step=100)
    os.write(1, (json.dumps({"child": os.getpid(), "sent": train.sent(), "ok": ok,
                             "same": train._state.sock is parent_sock,
                             "inherited_closed": parent_sock.fileno() == -1}) + "\n").encode())
    os._exit(0)
os.waitpid(pid, 0)
print(json.dumps({"parent": os.getpid(), "sent": train.sent()}), flush=True)
"""
    env = {**os.environ, "CLUSTERWATCH_TRAIN_SOCKET": endpoint.path}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30,
                         check=True).stdout.splitlines()
    child, parent = json.loads(out[0]), json.loads(out[1])
    assert child["ok"] and child["sent"] == 1 and not child["same"] and child["inherited_closed"]
    assert parent["sent"] == 2  # the tags and step 1; the child's send is not counted here
    reports = wait_reports(endpoint, 3)
    by_pid = {(r.pid, r.step) for r in reports}
    assert (child["child"], 100) in by_pid and (parent["parent"], 1) in by_pid
    child_report = next(r for r in reports if r.pid == child["child"])
    assert child_report.tags == {"run": "r1"}  # the child's first report carries the labels


def test_threads_count_every_report_once(sock_dir):
    os.environ["CLUSTERWATCH_TRAIN_SOCKET"] = str(sock_dir / "nobody-listens.sock")
    try:
        train._state.sock = None
        train._state.absent_until = 0.0
        sent0, dropped0 = train.sent(), train.dropped()
        threads = [threading.Thread(target=lambda: [train.report(step=i) for i in range(500)]) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert (train.sent() - sent0) + (train.dropped() - dropped0) == 4000
    finally:
        del os.environ["CLUSTERWATCH_TRAIN_SOCKET"]
        train._state.sock = None
        train._state.absent_until = 0.0


def test_queue_overflow_drops_the_oldest(sock_dir):
    ep = TrainEndpoint(str(sock_dir / "q.sock"), max_queue=5)
    ep.start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            for i in range(20):
                s.sendto(json.dumps({"v": 1, "step": i}).encode(), ep.path)
                time.sleep(0.005)
        deadline = time.monotonic() + 5
        while ep.received < 20 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [r.step for r in ep.drain()] == [15, 16, 17, 18, 19]
        assert (ep.received, ep.overflowed, ep.rejected) == (20, 15, 0)
    finally:
        ep.close()
    assert not os.path.exists(ep.path)


def test_refuses_a_socket_directory_others_can_write(sock_dir):
    shared = sock_dir / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match="not be writable"):
        TrainEndpoint(str(shared / "t.sock")).start()


def test_parse_datagram_takes_identity_from_the_caller_only():
    r = parse_datagram(b'{"v":1,"step":3,"pid":1,"loss":0.5,"m":{"acc":1},"tags":{"e":"x"}}', 42, 9.5, 100.0)
    assert (r.pid, r.start_time, r.time, r.step, r.loss, r.metrics, r.tags) == (
        42, 9.5, 100.0, 3, 0.5, {"acc": 1.0}, {"e": "x"})


# -- ready callbacks, with stand-ins shaped like the frameworks' objects -----------------------


class Recorder:
    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, **kw) -> bool:
        self.calls.append(kw)
        return True


class HFState:  # transformers.TrainerState's fields that the callback reads
    def __init__(self, global_step: int, epoch: float) -> None:
        self.global_step, self.epoch = global_step, epoch


def test_hf_reporter_reports_steps_and_logs():
    rec = Recorder()
    cb = HFReporter(report=rec)
    control = object()
    assert cb.on_step_end(None, HFState(10, 0.5), control) is control
    cb.on_log(None, HFState(10, 0.5), control, logs={"loss": 1.25, "learning_rate": 3e-4, "epoch": 0.5,
                                                       "grad_norm": 2.0, "train_runtime": 12.0,
                                                       "note": "text", "bad": float("nan")})
    assert rec.calls == [
        {"step": 10, "epoch": 0.5},
        {"step": 10, "loss": 1.25, "lr": 3e-4, "epoch": 0.5, "grad_norm": 2.0, "train_runtime": 12.0},
    ]


class Scalar:  # a one-element tensor: .item() gives a Python number
    def __init__(self, v: float) -> None:
        self.v = v

    def item(self) -> float:
        return self.v


class Optim:
    param_groups = [{"lr": 0.01}]


class PLTrainer:  # the lightning.Trainer attributes the callback reads
    def __init__(self, step: int) -> None:
        self.global_step, self.current_epoch, self.log_every_n_steps = step, 2, 50
        self.callback_metrics = {"train_loss": Scalar(0.75), "val_acc": Scalar(0.9)}
        self.optimizers = [Optim()]


def test_lightning_reporter_reports_each_batch_and_metrics_on_log_steps():
    rec = Recorder()
    cb = LightningReporter(report=rec)
    cb.on_train_batch_end(PLTrainer(49), None, None, None, 0)
    cb.on_train_batch_end(PLTrainer(50), None, None, None, 1)
    assert rec.calls == [{"step": 49, "epoch": 2},
                         {"step": 50, "epoch": 2, "loss": 0.75, "lr": 0.01, "val_acc": 0.9}]


def test_hf_reporter_end_to_end_through_the_endpoint(endpoint):
    os.environ["CLUSTERWATCH_TRAIN_SOCKET"] = endpoint.path
    try:
        train._state.sock = None
        train._state.absent_until = 0.0
        HFReporter().on_log(None, HFState(3, 1.0), None, logs={"loss": 0.5, "learning_rate": 0.1})
        reports = wait_reports(endpoint, 1)
        assert [(r.pid, r.step, r.loss, r.lr, r.epoch) for r in reports] == [(os.getpid(), 3, 0.5, 0.1, 1.0)]
    finally:
        del os.environ["CLUSTERWATCH_TRAIN_SOCKET"]
        train._state.sock = None


@pytest.mark.parametrize("module, library", [("clusterwatch.integrations.hf", "transformers"),
                                             ("clusterwatch.integrations.lightning", "lightning")])
def test_integrations_need_their_library(module, library):
    import importlib
    import importlib.util

    installed = importlib.util.find_spec(library) is not None or (
        library == "lightning" and importlib.util.find_spec("pytorch_lightning") is not None)
    if installed:
        assert importlib.import_module(module).ClusterwatchCallback
    else:
        with pytest.raises(ImportError, match=f"needs .*{library}"):
            importlib.import_module(module)


# -- a hostile datagram against a real agent and collector ------------------------------------

HOSTILE_TRAINER = r"""
import socket, sys, time
from clusterwatch import train
path = sys.argv[1]
raw = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
step = 0
while True:
    # the datagram of issue 13: valid JSON, a lone surrogate the protobuf message cannot carry
    try:
        raw.sendto(b'{"v":1,"tags":{"x":"\\ud800"}}', path)
    except OSError:
        pass  # the agent is not listening yet
    train.report(step=step, loss=1.0)
    step += 1
    time.sleep(0.05)
"""


def test_a_datagram_protobuf_cannot_carry_does_not_blind_the_node(tmp_path):
    from tests.support.helpers import CLI, Collector, Proc, metric_value, wait_for

    sock = tmp_path / "train.sock"
    script = tmp_path / "hostile.py"
    script.write_text(HOSTILE_TRAINER)
    collector = Collector(tmp_path)
    sender = Proc([sys.executable, str(script), str(sock)], tmp_path / "hostile.log",
                  env={**os.environ, "CLUSTERWATCH_TRAIN_SOCKET": str(sock)})
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "dg-node", "--interval", "0.3",
                  "--send-interval", "0", "--gpu-source", "none", "--no-provenance", "--pid", str(sender.pid),
                  "--job-id", "dg-1", "--spool-dir", str(tmp_path / "spool"), "--train-socket", str(sock)],
                 tmp_path / "agent.log")

    def step() -> float:
        return metric_value(collector.metrics(), "clusterwatch_rank_step", job_id="dg-1") or 0

    def samples() -> float:
        return metric_value(collector.metrics(), "clusterwatch_ingest_samples_total") or 0

    try:
        # every poll drains bad datagrams beside good reports: the good ones and the samples still arrive
        wait_for(lambda: step() >= 20, timeout=30, what="the training steps of the same process")
        before = samples()
        wait_for(lambda: samples() >= before + 5, timeout=30, what="the node's samples to keep flowing")
        assert "poll failed" not in agent.text() and "UnicodeEncodeError" not in agent.text()
        # said once, with the reason; every later one is counted only
        assert agent.text().count("dropped a report from pid") == 1, agent.text()
        assert "lone surrogate" in agent.text()
    finally:
        agent.stop()
        sender.stop()
        collector.stop()
