"""Machine output on stdout, messages on stderr, and no terminal codes where stdout is not a terminal."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess

import pytest

from tests.support.helpers import CLI, clean_environ, cli, wait_for

pytestmark = pytest.mark.e2e


def test_run_json_goes_to_stdout_after_the_commands_output():
    r = cli("run", "--json", "--interval", "0.5", "--gpu-source", "none", "--",
            "sh", "-c", "sleep 1.5; echo from-the-command", timeout=90)
    assert r.returncode == 0, r.stderr
    before, _, report = r.stdout.partition("from-the-command\n")
    assert before == ""
    doc = json.loads(report)  # `clusterwatch run --json -- CMD | jq` reads it
    assert doc["job"]["job_id"].startswith("local-")
    assert '"job_id"' not in r.stderr


@pytest.mark.parametrize("as_json", [True, False])
def test_run_output_writes_the_report_to_a_file(tmp_path, as_json):
    report = tmp_path / "report"
    r = cli("run", *(["--json"] if as_json else []), "-o", str(report), "--interval", "0.5", "--gpu-source",
            "none", "--", "sh", "-c", "sleep 1.5; echo out", timeout=90)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "out\n"
    text = report.read_text()
    if as_json:
        assert json.loads(text)["job"]["job_id"].startswith("local-")
    else:
        assert "clusterwatch · job local-" in text and "clusterwatch · job" not in r.stderr
    assert f"report written to {report}" in r.stderr


def test_run_output_into_a_missing_folder_fails_before_the_command_runs(tmp_path):
    r = cli("run", "-o", str(tmp_path / "nope" / "r.json"), "--", "touch", str(tmp_path / "ran"), timeout=60)
    assert r.returncode == 2 and "cannot write the report" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "ran").exists()


@pytest.fixture
def running_job(tmp_path):
    """A job the collector of a real `clusterwatch run` knows: (job id, collector address)."""
    err = tmp_path / "run.err"
    with open(err, "wb") as f:
        proc = subprocess.Popen([*CLI, "run", "--interval", "0.5", "--gpu-source", "none", "--status-every", "0",
                                 "--", "sleep", "60"], stdout=subprocess.DEVNULL, stderr=f, env=clean_environ())
    try:
        found = wait_for(lambda: re.search(r"watching (local-\d+) .*collector on (\S+)", err.read_text()),
                         timeout=60, what="run's collector")
        job, address = found.groups()
        wait_for(lambda: cli("status", job, "--collector", address).returncode == 0, timeout=30,
                 what="the job's first samples")
        yield job, address
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def _faulthandler_env() -> dict[str, str]:
    # a watch that outlives its SIGINT prints where each thread is when _ended aborts it
    return dict(clean_environ(), PYTHONFAULTHANDLER="1")


def _ended(proc: subprocess.Popen) -> str:
    """The stderr of a `status --watch` sent SIGINT, once it has exited; a failure with its threads' stacks
    (SIGABRT, faulthandler) if it is still there after 30 s."""
    try:
        return proc.communicate(timeout=30)[1].decode(errors="replace")
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        stacks = proc.communicate(timeout=30)[1].decode(errors="replace")
        raise AssertionError(f"status --watch still running 30 s after SIGINT; its threads:\n{stacks}") from None


def _watch(tmp_path, *args: str) -> str:
    out = tmp_path / "watch.out"
    with open(out, "wb") as f:  # a file, as in `status --watch > f`
        proc = subprocess.Popen([*CLI, "status", *args, "--watch", "-n", "0.5"], stdout=f,
                                stderr=subprocess.PIPE, env=_faulthandler_env())
    try:
        wait_for(lambda: out.read_bytes().count(b"local-") >= 3 or proc.poll() is not None, timeout=30,
                 what="three refreshes")
    finally:
        proc.send_signal(signal.SIGINT)
        err = _ended(proc)
    assert proc.returncode == 0, err
    return out.read_text()


def test_status_watch_into_a_file_writes_no_terminal_codes(tmp_path, running_job):
    job, address = running_job
    text = _watch(tmp_path, job, "--collector", address)
    assert "\x1b" not in text
    assert text.count("clusterwatch · job") >= 2 and text.count("\n--- ") >= 1


def test_status_json_watch_into_a_file_is_one_document_a_line(tmp_path, running_job):
    job, address = running_job
    text = _watch(tmp_path, job, "--collector", address, "--json")
    assert "\x1b" not in text
    docs = [json.loads(line) for line in text.splitlines()]
    assert len(docs) >= 2 and all(d["job"]["job_id"] == job for d in docs)


def test_status_watch_does_not_take_the_job_id_for_its_interval(tmp_path, running_job):
    job, address = running_job
    out = tmp_path / "watch.out"
    with open(out, "wb") as f:
        proc = subprocess.Popen([*CLI, "status", "--watch", job, "--collector", address], stdout=f,
                                stderr=subprocess.PIPE, env=_faulthandler_env())
    try:
        wait_for(lambda: f"job {job}" in out.read_text() or proc.poll() is not None, timeout=30,
                 what="the first report")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        err = _ended(proc)
    assert f"job {job}" in out.read_text(), err


def test_status_with_an_empty_job_id_says_so():
    r = cli("status", "", "--collector", "127.0.0.1:1")
    assert r.returncode == 2 and "is empty" in r.stderr and "Traceback" not in r.stderr
    assert os.linesep.join(r.stderr.splitlines()[-1:]).startswith("Error: Invalid value for 'JOB_ID'")
