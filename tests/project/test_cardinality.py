"""bench/cardinality.py: its classes of series, from a real collector fed by simulated nodes, and its scaling."""
from __future__ import annotations

import sys

from tests.support.helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import cardinality  # noqa: E402


def test_classes_by_labels():
    text = ('a{job_id="1",node="n",rank="0"} 1\nb{gpu="u",node="n",index="0"} 1\nc{job_id="1"} 1\n'
            'd{node="n"} 1\ne 1\nf{job_id="1",node="n"} 1\n')
    assert cardinality.classify(text) == {"rank": 1, "gpu": 1, "job": 1, "node": 1, "collector": 1, "job_node": 1}


def test_a_real_collector_per_node_series_follow_its_gpus_and_ranks():
    m = cardinality.measure(nodes_per_job=1)
    per_node = m["per_node"]
    # 8 GPUs and 8 ranks a node: whole series for each; the collector's own do not grow with the load
    assert per_node["gpu"] == 8 * m["per_gpu"] and m["per_gpu"] >= 2 and m["per_gpu"].is_integer()
    assert per_node["rank"] == 8 * m["per_rank"] and m["per_rank"] >= 2 and m["per_rank"].is_integer()
    assert per_node["node"] >= 1 and m["per_job_only"] >= 1 and m["added_by_a_job"]["collector"] == 0
    one, ten = cardinality.scale(m, 1_000, 1), cardinality.scale(m, 10_000, 10)
    assert ten["series_per_shard"] == one["series_per_shard"]  # 10 shards of 1,000 nodes each
    assert ten["engine_series"] == 10 * ten["series_per_shard"] + 10 * cardinality.PROMETHEUS_PER_TARGET
