"""The agent's configuration: one frozen object, built in clusterwatch.cli and passed in."""
from __future__ import annotations

from dataclasses import dataclass

from clusterwatch.agent.health.fabric import ExpectedRates

# 15 minutes of 64 processes polled every second, with room to spare: a collector restart or a
# short network cut loses nothing.
DEFAULT_BUFFER_SAMPLES = 100_000
DEFAULT_SPOOL_DIR = "/run/clusterwatch"


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Everything the agent needs to run.

    Attributes:
        collector: collector address HOST:PORT, or the deployment's collectors list `a:1,b:2,c:3`
            (clusterwatch/shards.py: a stream to each the node has data for); None to only print
            (`--once --json`).
        collectors_before: `JOB=HOST:PORT,...`: the list the jobs numbered below JOB started on (a list
            that changed); "" when the list has not changed.
        node: node name written on every sample.
        interval_s: poll interval in seconds.
        send_interval_s: polls are joined into one batch sent this often (each poll when the poll
            interval is as long or longer); a job event goes out with its poll. At 1 Hz a batch of
            five polls costs the collector about what one poll does (the cost is per message).
        gpu_source: "auto", "nvml", "sim" or "none".
        sim_scenario: scenario file for the simulated GPU source (None: the embedded default).
        sim_run: the run token of the processes the simulated source plays (None: those without one).
        pids: processes to watch besides those on a GPU (and their descendants), each (pid, start time in
            Unix seconds, or None: the start time the process has when the agent starts).
        local_job_id: job id given to the `pids` trees (`clusterwatch run` uses "local-PID").
        buffer_max_samples: bound of the unacknowledged buffer in process samples.
        token: shared secret for the collector, if it requires one.
        agent_auth: what the agent proves besides the token and certificate: "auto" (a munge credential
            where munge is installed), "munge" (always: no stream without one), "token", "tls", "none" (none).
        munge_socket: munged's socket when not the default.
        tls_ca / tls_cert / tls_key: PEM files for TLS / mutual TLS to the collector.
        spool_dir: where the prolog/epilog leave job events and the agent keeps its pid file.
        train_socket: Unix socket for clusterwatch.train reports (None: <spool_dir>/train.sock).
        count_fds: count each process's open file descriptors.
        watch_all_gpu_processes: watch every process NVML reports, not only Slurm jobs'.
        provenance: record each rank process's git provenance once.
        process_source: "auto" (the /proc reader where there is a Linux /proc, else psutil), "proc" or
            "psutil".
        kmsg: the kernel log read for the driver's XID lines (/dev/kmsg; a file or FIFO in tests);
            None: not read (the CLI's default is /dev/kmsg). The same log's NVSwitch SXID lines are read too.
        ib_sysfs: the InfiniBand / RoCE ports' sysfs folder, read on the health cadence (/sys/class/infiniband;
            a tree shaped like it in tests); None: not read (the CLI's default is /sys/class/infiniband).
        ib_expect: the rate each port should run at (--ib-expect-rate, parse_expected_rates), sent with its
            readings: a port below it is fabric_port's `degraded`; empty: nothing expected (split cables run at 2X).
        health_interval_s: how often the GPUs' health counters are read (ECC, throttling, ...).
        tmpfs_interval_s: how often the node's tmpfs mounts are walked for what each uid's files hold there
            (agent/tmpfs.py), on a thread of its own; 0: not walked.
        activity_interval_s: how often the GPUs' true activity (NVML GPM: SM, tensor, DRAM) is read, each
            reading the activity over that window; 0: not read.
        read_job_output: read the progress of jobs that do not call clusterwatch.train from their own output
            files (stdout/stderr), each opened as its owner (agent/job_output.py); off unless the site allows it.
        job_output_regex: the site's pattern for progress lines (named groups step, loss, lr), besides the
            built-in tqdm, Hugging Face Trainer and Lightning ones; "" for none.
    """

    collector: str | None
    node: str
    interval_s: float = 5.0
    send_interval_s: float = 5.0
    gpu_source: str = "auto"
    sim_scenario: str | None = None
    sim_run: str | None = None
    pids: tuple[tuple[int, float | None], ...] = ()
    local_job_id: str = ""
    buffer_max_samples: int = DEFAULT_BUFFER_SAMPLES
    token: str | None = None
    agent_auth: str = "auto"
    munge_socket: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    spool_dir: str = DEFAULT_SPOOL_DIR
    train_socket: str | None = None
    count_fds: bool = True
    watch_all_gpu_processes: bool = True
    provenance: bool = True
    process_source: str = "auto"
    kmsg: str | None = None
    ib_sysfs: str | None = None
    ib_expect: ExpectedRates = ExpectedRates()
    health_interval_s: float = 30.0
    activity_interval_s: float = 10.0
    tmpfs_interval_s: float = 30.0
    collectors_before: str = ""
    read_job_output: bool = False
    job_output_regex: str = ""
