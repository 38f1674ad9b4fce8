"""status's Health section, rendered from a JobView."""
from __future__ import annotations

from clusterwatch.v1 import query_pb2

from clusterwatch.report.health import health_section


def test_health_findings_worst_first_with_their_advice() -> None:
    view = query_pb2.JobView()
    view.health.add(time=100.0, rule="gpu_xid", severity="warning", node="n1", gpu="GPU-b",
                    description="XID 13 (Graphics Engine Exception) on GPU GPU-b of n1: process python (pid 7)",
                    advice="Fix or restart the application.", action="restart_app")
    view.health.add(time=50.0, rule="gpu_lost", severity="critical", node="n1", gpu="GPU-a", rank=3,
                    description="GPU GPU-a of n1 fell off the bus (XID 79); it held job 601 rank 3",
                    advice="Every process on the GPU is lost. Drain the node and reboot it; RMA if it recurs.",
                    action="drain")
    lines = health_section(view, None)
    text = "\n".join(lines)
    assert lines[1] == "Health"
    assert text.index("fell off the bus") < text.index("XID 13")
    assert "● CRITICAL" in text and "◐ WARNING" in text
    assert "→ Every process on the GPU is lost." in text
    narrow = health_section(view, 60)
    assert all(len(line) <= 60 for line in narrow if not line.startswith("─"))


def test_no_findings_no_section() -> None:
    assert health_section(query_pb2.JobView(), 100) == []
