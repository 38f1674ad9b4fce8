"""The exported metric families (name, type, help, label names) and how a job's run tags become labels."""
from __future__ import annotations

import itertools
import string
from collections.abc import Iterable
from typing import NamedTuple

# Run tags become labels of clusterwatch_job_info: a small set, fixed per job (its first tags,
# in the order they arrived), so a job that sends ever more tag keys makes no new label names. Their
# values are bounded in churn where they enter the state (state.MAX_TAG_CHANGES): a value that changes
# at every report would otherwise make a new series at every scrape.
MAX_TAG_LABELS = 8
MAX_TAG_NAME = 32   # characters of the name after "tag_"
MAX_TAG_VALUE = 128
# str.isalnum() is true for "é", "²", "٣": Prometheus label names are ASCII [a-zA-Z_][a-zA-Z0-9_]*,
# and promtool's lint wants them snake_case (it fails `aA`), hence lower case only
_LABEL_NAME_CHARS = frozenset(string.ascii_lowercase + string.digits + "_")


def tag_label_name(key: str) -> str:
    """tag_<key> in lower case, each character Prometheus does not allow in a label name turned into `_`.

    The prefix keeps the result a valid name (never starting with a digit or `__`) and apart from
    the job's own labels (job_id, user, name, ...).
    """
    return "tag_" + "".join(c if c in _LABEL_NAME_CHARS else "_" for c in key[:MAX_TAG_NAME].lower())


def tag_labels(tags: dict[str, str], taken: Iterable[str] = ()) -> dict[str, str]:
    """A job's run tags as label pairs: at most MAX_TAG_LABELS, the first ones the job reported.

    Args:
        tags: the job's tags, in the order they arrived.
        taken: label names the family already has; a tag that would map onto one is left out,
            as is a tag whose name maps onto an earlier tag's (`lr-sched` and `lr_sched`): a
            label name twice in one series makes the whole exposition unparsable.
    """
    out: dict[str, str] = {}
    reserved = set(taken)
    # a bounded look (this runs under the core's lock): names that collide cost at most this many
    for key, value in itertools.islice(tags.items(), 4 * MAX_TAG_LABELS):
        if len(out) >= MAX_TAG_LABELS:
            break
        name = tag_label_name(key)
        if name in out or name in reserved:
            continue
        out[name] = str(value)[:MAX_TAG_VALUE]
    return out


class Family(NamedTuple):
    """One metric family as exported: name as OpenMetrics has it (a counter without `_total`, an info
    without `_info`), type (gauge, counter, info), help, and its label names in the order of the values."""

    name: str
    type: str
    help: str
    labels: tuple[str, ...]

    @property
    def sample_name(self) -> str:
        return self.name + {"counter": "_total", "info": "_info"}.get(self.type, "")


def family(name: str, type_: str, help_text: str, *labels: str) -> Family:
    """A Family, its label names given one by one."""
    return Family(name, type_, help_text, labels)


RANK_LABELS = ("job_id", "node", "rank")
GPU_LABELS = ("node", "gpu", "index", "job_id")
JOB_INFO = family("clusterwatch_job", "info", "A running job (value 1; labels describe it, run tags as tag_<name>).",
                  "job_id", "user", "name", "partition", "state")
JOB_CODE = family("clusterwatch_job_code", "info", "The code a running job runs, from git provenance (the most "
                  "common version when ranks differ; versions counts them).",
                  "job_id", "commit", "branch", "dirty", "remote", "versions")
JOB_FAMILIES = (
    family("clusterwatch_job_processes", "gauge", "Live processes of the job.", "job_id"),
    family("clusterwatch_job_gpu_memory_used_bytes", "gauge", "GPU memory used by all the job's processes.", "job_id"),
    family("clusterwatch_job_rss_bytes", "gauge", "Resident host memory of all the job's processes.", "job_id"),
)
# What a running job's GPUs cost while it held them (collector/state/job_cost.py), summed over its GPUs: counters
# from the job's start, so increase() over any window is what that window cost. A job with no figure of a kind
# (no GPU with an energy counter, no throttle time) has no series of it.
JOB_COST_FAMILIES = (
    family("clusterwatch_job_gpu_energy_joules", "counter", "Energy the job's GPUs used while it held them "
           "(NVML's energy counter; a GPU another job's process also used is the holder's whole).", "job_id"),
    family("clusterwatch_job_gpu_throttle_seconds", "counter", "Time the clocks of the job's GPUs were held down "
           "while it held them, by reason (NVML's violation policies).", "job_id", "reason"),
    family("clusterwatch_job_gpu_activity_seconds", "counter", "GPU-seconds the job held its GPUs at each "
           "activity level (percent range), by basis: sm_active where GPM is read, else utilization.",
           "job_id", "basis", "level"),
)
# in the order of a RankRow's values (snapshot.py), each named as its field after "clusterwatch_rank_"
RANK_FAMILIES = (
    family("clusterwatch_rank_gpu_memory_used_bytes", "gauge", "GPU memory used by the rank's process.",
           *RANK_LABELS),
    family("clusterwatch_rank_rss_bytes", "gauge", "Resident host memory of the rank's process.", *RANK_LABELS),
    family("clusterwatch_rank_cpu_ratio", "gauge", "CPU use of the rank's process (1 = one core).", *RANK_LABELS),
    family("clusterwatch_rank_gpu_utilization_ratio", "gauge", "SM utilisation by the rank's process (0-1).",
           *RANK_LABELS),
    family("clusterwatch_rank_threads", "gauge", "Threads of the rank's process.", *RANK_LABELS),
    family("clusterwatch_rank_open_fds", "gauge", "Open file descriptors of the rank's process.", *RANK_LABELS),
    family("clusterwatch_rank_step", "gauge", "Training step the rank last reported.", *RANK_LABELS),
    family("clusterwatch_rank_steps_per_second", "gauge", "Training steps per second (recent).", *RANK_LABELS),
    family("clusterwatch_rank_loss", "gauge", "Training loss the rank last reported.", *RANK_LABELS),
    family("clusterwatch_rank_learning_rate", "gauge", "Learning rate the rank last reported.", *RANK_LABELS),
)
PROCESS_LABELS = ("job_id", "node", "pid", "command")
# in the order of a ProcessRow's values (snapshot.py), each named as its field after "clusterwatch_process_"
PROCESS_FAMILIES = (
    family("clusterwatch_process_gpu_memory_used_bytes", "gauge", "GPU memory used by the process.",
           *PROCESS_LABELS),
    family("clusterwatch_process_rss_bytes", "gauge", "Resident host memory of the process.", *PROCESS_LABELS),
    family("clusterwatch_process_cpu_ratio", "gauge", "CPU use of the process (1 = one core).", *PROCESS_LABELS),
)
GPU_FAMILIES = (
    family("clusterwatch_gpu_utilization_ratio", "gauge", "GPU utilisation (0-1).", *GPU_LABELS),
    family("clusterwatch_gpu_memory_used_bytes", "gauge", "GPU memory used.", *GPU_LABELS),
    family("clusterwatch_gpu_memory_total_bytes", "gauge", "GPU memory size.", "node", "gpu", "index"),
    family("clusterwatch_gpu_power_watts", "gauge", "GPU board power draw.", "node", "gpu", "index"),
)
# What the GPU's units did over the last GPM window (NVML GPU Performance Monitoring, Hopper and later; a MIG
# instance has its own): utilisation reads 100 % while a collective spins on one SM, these do not. In the order of
# GpuActivity's figures (clusterwatch/model.py), the two throughputs of a link as one family by direction. A GPU
# without GPM, or a figure it does not offer (NVLink on a PCIe card), has no series: absent(), not 0.
ACTIVITY_FAMILIES = (
    family("clusterwatch_gpu_sm_activity_ratio", "gauge", "Share of the GPU's SMs busy over the last GPM window "
           "(0-1).", *GPU_LABELS),
    family("clusterwatch_gpu_sm_occupancy_ratio", "gauge", "Resident warps against the SMs' maximum over the last "
           "GPM window (0-1).", *GPU_LABELS),
    family("clusterwatch_gpu_tensor_activity_ratio", "gauge", "Time the SMs issued tensor-core instructions over "
           "the last GPM window (0-1).", *GPU_LABELS),
    family("clusterwatch_gpu_dram_activity_ratio", "gauge", "DRAM bandwidth used against its peak over the last "
           "GPM window (0-1).", *GPU_LABELS),
    family("clusterwatch_gpu_pcie_bytes_per_second", "gauge", "PCIe throughput over the last GPM window, by "
           "direction (tx: from the GPU, rx: to it).", *GPU_LABELS, "direction"),
    family("clusterwatch_gpu_nvlink_bytes_per_second", "gauge", "NVLink throughput over all the GPU's links over "
           "the last GPM window, by direction (tx: from the GPU, rx: to it).", *GPU_LABELS, "direction"),
)
NODE_FAMILIES = (
    family("clusterwatch_node_up", "gauge", "1 when the node's agent reported within 3 intervals.", "node"),
    family("clusterwatch_node_memory_total_bytes", "gauge", "Host memory of the node.", "node"),
    family("clusterwatch_node_last_seen_timestamp_seconds", "gauge",
           "When the node's agent last reported (Unix seconds).", "node"),
    family("clusterwatch_agent_samples_dropped", "counter", "Samples the node's agent dropped on buffer overflow.",
           "node"),
    family("clusterwatch_agent_read_errors", "counter", "Reads of /proc, NVML or the health sources that failed on "
           "the node.", "node"),
    family("clusterwatch_agent_job_output_files", "gauge", "Jobs' output files the node's agent follows for their "
           "progress (--read-job-output).", "node"),
    family("clusterwatch_agent_job_output_refused", "counter", "Jobs' output files the node's agent would not open "
           "(another owner's, not a regular file, on FUSE, the owner could not open it).", "node"),
    family("clusterwatch_agent_job_output_errors", "counter", "Reads of jobs' output that failed on the node.",
           "node"),
)
ALERT_FAMILY = family("clusterwatch_alert", "gauge", "Alerts pending or firing (1 per alert).",
                      "rule", "severity", "state", "job_id", "node", "rank")
