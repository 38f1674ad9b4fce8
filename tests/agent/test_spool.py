"""agent/spool.py: the hook events a Slurm prolog/epilog leaves for the agent."""
from __future__ import annotations

import json

from clusterwatch.agent.spool import parse_event
from hypothesis import given
from hypothesis import strategies as st


@given(st.text(max_size=300))
def test_event_parser_never_raises_anything_but_value_error(text):
    try:
        parse_event(text)
    except ValueError:
        pass


def test_event_parser_accepts_a_hook_event():
    e = parse_event(json.dumps({"kind": "end", "job_id": "77", "time": 5.0, "uid": 1000, "exit_code": 3}))
    assert (e.kind, e.job_id, e.uid, e.exit_code) == ("end", "77", 1000, 3)
