"""The Prometheus endpoint: metric families built at scrape time from the collector's state.

Each scrape builds the families from the current state (no long-lived Gauges), so a job's
series disappear from /metrics as soon as it ends, with no label bookkeeping. Base units, a
`clusterwatch_` prefix, no label named `job` (the Slurm job is `job_id`); a job's run tags are
labels `tag_<name>` of clusterwatch_job_info, at most 8, the name in lower-case ASCII. Per-job, per-rank
and per-GPU series by default; per-process series (label `pid`) only when asked for, because
pids are unbounded over time.

A scrape runs in two steps: a snapshot copies what the families need out of the state into named rows,
under the core's lock, and the text is written from it outside the lock. By job:

    families.py   the families (name, type, help, labels) and run tags as labels
    snapshot.py   the snapshot's rows, and taking them from the state (the only part reading it)
    series.py     each family's rows from a snapshot, and as prometheus_client families
    text.py       the exposition text, written by hand for speed (prometheus_client's, line for line)
    collector.py  ClusterCollector (a prometheus_client Collector) and Exposition, the scrape path
    http.py       /metrics over HTTP on the collector's bounded server (collector/serving/bounded_http.py)
"""
from .collector import ClusterCollector, Exposition
from .families import MAX_TAG_LABELS, MAX_TAG_NAME, MAX_TAG_VALUE, Family, family, tag_label_name, tag_labels
from .http import metrics_app, serve_metrics
from .text import TextWriter, format_value, label_string, same_exposition

__all__ = ["MAX_TAG_LABELS", "MAX_TAG_NAME", "MAX_TAG_VALUE", "ClusterCollector", "Exposition", "Family",
           "TextWriter", "family", "format_value", "label_string", "metrics_app", "same_exposition",
           "serve_metrics", "tag_label_name", "tag_labels"]
