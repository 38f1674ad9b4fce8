"""docs/simulated-gpus.md says what the simulated GPU source does: its scenarios parse, its tables name every
profile kind, event kind, throttle reason and CLUSTERWATCH_SIM_* variable the source has, and its error is the
agent's own."""
from __future__ import annotations

import re
import subprocess

from clusterwatch.agent.backends import sim
from clusterwatch.agent.backends.sim_scenario import EVENT_KINDS, KINDS, THROTTLE_REASONS, parse_scenario

from tests.support.helpers import CLI, ROOT, clean_environ

DOC = (ROOT / "docs" / "simulated-gpus.md").read_text()
SCENARIOS = re.findall(r"```toml\n(.*?)```", DOC, re.S)


def _first_column(heading: str) -> list[str]:
    """The backquoted first cells of the table under `heading`."""
    section = DOC.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", section, re.M)


def test_every_scenario_the_page_shows_parses() -> None:
    assert len(SCENARIOS) == 2
    for text in SCENARIOS:
        parse_scenario(text, "docs/simulated-gpus.md")


def test_the_page_names_every_kind_reason_and_variable() -> None:
    assert _first_column("Profiles") == list(KINDS)
    assert _first_column("GPU health events") == list(EVENT_KINDS)
    reasons = DOC.split("A throttle's `reasons` are any of ", 1)[1].split(";", 1)[0]
    assert sorted(re.findall(r"`(\w+)`", reasons)) == sorted(THROTTLE_REASONS)
    variables = [v.split("=")[0] for v in _first_column("How a process asks for a simulated GPU")]
    assert sorted(variables) == sorted(set(re.findall(r"^\s+(CLUSTERWATCH_SIM_\w+)=", sim.__doc__, re.M)))


def test_the_error_the_page_shows_is_the_agents(tmp_path) -> None:
    shown = re.search(r"```\n(clusterwatch: scenario .*)\n```", DOC).group(1)
    (tmp_path / "scenario.toml").write_text(SCENARIOS[-1].replace('["hw_thermal_slowdown"]', '["too_hot"]'))
    r = subprocess.run([*CLI, "agent", "--once", "--gpu-source", "sim", "--sim-scenario", "scenario.toml",
                        "--spool-dir", "spool", "--train-socket", "train.sock"], cwd=tmp_path,
                       env=clean_environ(), capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stderr.strip()) == (2, shown)
