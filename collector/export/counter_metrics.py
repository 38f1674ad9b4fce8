"""The collector's counters as /metrics names them: each count's Prometheus name and help, in one table."""
from __future__ import annotations

from collections.abc import Mapping

from ..ingest.checks import REFUSAL_REASONS

# count name (CollectorCore.counts, IngestServicer.counts, JobRegistry) → (metric name without _total, help)
COUNTERS: dict[str, tuple[str, str]] = {
    "batches": ("clusterwatch_ingest_batches", "Batches stored."),
    "samples": ("clusterwatch_ingest_samples", "Process samples stored."),
    "duplicates": ("clusterwatch_ingest_duplicates", "Resent batches dropped as duplicates."),
    "rejected": ("clusterwatch_ingest_rejected", "Messages rejected as malformed or oversized."),
    "unauthenticated": ("clusterwatch_ingest_unauthenticated", "Streams refused for bad credentials."),
    "throttled": ("clusterwatch_ingest_throttled", "Batches slowed down because one agent sent too much."),
    **{f"refused_{reason}": (f"clusterwatch_ingest_refused_{reason}", text)
       for reason, text in REFUSAL_REASONS.items()},
    "training_unmatched": ("clusterwatch_ingest_training_unmatched",
                           "Training reports dropped: no known process has their node, pid and start time."),
    "tags_dropped": ("clusterwatch_ingest_tags_dropped",
                     "Run tags dropped: past 32 keys a job, or a key or value too long."),
    "tag_changes_dropped": ("clusterwatch_ingest_tag_changes_dropped",
                            "Run tag values not shown: their key had changed 4 times in the job (it shows "
                            "'(changes too often)')."),
    "other_shard_dropped": ("clusterwatch_ingest_other_shard_dropped",
                            "Process samples, job events and health records a shard dropped: the collectors list "
                            "gives their job (or node) to another collector."),
    "store_errors": ("clusterwatch_store_errors", "Flushes and job closes the store refused (retried)."),
    "callback_errors": ("clusterwatch_ingest_callback_errors",
                        "Rules, alerts or registry callbacks that failed on a batch."),
    "identity_refused": ("clusterwatch_ingest_identity_refused",
                         "Agent streams refused: the client certificate (or, under munge, the host) does not "
                         "match the hello's node."),
    "node_taken": ("clusterwatch_ingest_node_taken",
                   "Agent streams refused: another stream speaks for the hello's node."),
    "health_repeated": ("clusterwatch_health_records_repeated",
                        "GPU health records dropped as had before: a kernel-log record read again, one XID twice."),
    "drains_refused": ("clusterwatch_actions_drains_refused",
                       "Drain steps refused: the alert's node is not one plain node name, or its agent proved "
                       "nothing."),
    "drains_held": ("clusterwatch_actions_drains_held",
                    "Drain steps held by the circuit breaker (--drain-max-nodes, --drain-max-share in "
                    "--drain-window): the alert notified only."),
    "alertmanager_errors": ("clusterwatch_alertmanager_send_errors",
                            "Sends of alerts to an Alertmanager that failed (refused, timed out, an HTTP error); "
                            "retried with backoff, except those it refused as malformed."),
    "alertmanager_dropped": ("clusterwatch_alertmanager_alerts_dropped",
                             "Alerts never sent to an Alertmanager: too many waited for it while it was away."),
    "web_forged": ("clusterwatch_web_requests_forged",
                   "Page requests refused (403): they carried the user header or a proxy secret without the "
                   "proxy's own secret, or from another address than the proxy's."),
    "web_other_users": ("clusterwatch_web_requests_other_users",
                        "Page requests refused (403): a loopback connection of another user than --web-owner-uid's."),
    "slurm_records_skipped": ("clusterwatch_slurm_records_skipped",
                              "Slurm job records left out because their values could forge another record's lines."),
}


def counter_families(counts: Mapping[str, float]) -> dict[str, tuple[float, str]]:
    """{metric name: (value, help)} for the exporter, from counts by name (each must be in COUNTERS)."""
    return {COUNTERS[name][0]: (value, COUNTERS[name][1]) for name, value in counts.items()}
