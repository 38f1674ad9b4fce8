"""The collector's --xid-catalog: a site's file over the shipped catalog; a wrong one stops the start in one line."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.helpers import cli

pytestmark = pytest.mark.e2e


def test_a_wrong_site_catalog_stops_the_collector_with_one_line(tmp_path: Path) -> None:
    site = tmp_path / "xids.toml"
    site.write_text('[xid.13]\nseverity = "fatal"\n')
    r = cli("collector", "--listen", "127.0.0.1:0", "--metrics-listen", "none", "--query-auth", "none",
            "--db", str(tmp_path / "db.sqlite"), "--xid-catalog", str(site), timeout=60)
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert (f"XID catalog {site}: line 2: [xid.13] severity must be one of info, warning, critical, "
            "not 'fatal'") in lines[0]
