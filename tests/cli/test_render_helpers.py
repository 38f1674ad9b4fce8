"""clusterwatch/report/text.py's small helpers: exit text, sizes, durations, sparklines."""
from __future__ import annotations

from clusterwatch.report.text import exit_text, human_bytes, human_duration, sparkline


def test_rendering_helpers():
    assert human_bytes(None) == "-" and human_bytes(512) == "512 B" and human_bytes(3 * 1024**3) == "3.0 GiB"
    # one format for every span, the alerts' too (clusterwatch.humanize.duration)
    assert human_duration(3725) == "1 h 2 min" and human_duration(90061) == "25 h 1 min"
    assert human_duration(45) == "45 s"
    assert sparkline([1, 1, 1]) == "▁▁▁"
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert len(sparkline(list(range(100)), width=12)) == 12
    # 128 + N is the job killed by signal N (as the collector writes Slurm's ExitCode=0:N)
    assert exit_text(0) == "exit code 0" and exit_text(7) == "exit code 7"
    assert exit_text(143) == "exit code 143: SIGTERM" and exit_text(137) == "exit code 137: SIGKILL"
    assert exit_text(128) == "exit code 128" and exit_text(255) == "exit code 255"
