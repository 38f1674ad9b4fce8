"""Bounds on every string an agent's stream carries, checked before any of it is held, stored or logged.

gRPC lets a message be as large as the collector's receive limit (64 MiB), so an 8 MiB node name would
otherwise become a state key, a store row, a Prometheus label and a log line. Two kinds of field:

- Names that identify something (node, boot id, job id, user, step, GPU UUID, health record ids, metric
  keys): refused over their bound, never cut. A cut name is another name: two jobs or GPUs sharing a
  prefix would be merged, and data would be put on something it is not about.
- Descriptions (command, wchan, the driver's text, a GPU's product name, the prolog's GPU list): cut in
  place. A prefix of a description is still true of what it describes.

A Hello that fails is refused whole (the stream is closed, INVALID_ARGUMENT); a batch that fails is refused
whole like any other refused batch (counted as `too_long`, its number acknowledged so the agent drops it).
The messages name the field and its bound, never the value. The bounds are far above anything real
(Slurm node names, Linux user names of 32 bytes, 20-digit job ids, NVML's 80-byte UUIDs).
"""
from __future__ import annotations

from clusterwatch.v1 import agent_pb2

from .checks import Refusal

# identities: refused beyond these (characters)
MAX_NODE = 253          # a fully qualified DNS name
MAX_BOOT_ID = 64
MAX_VERSION = 64
MAX_GPU_SOURCE = 16
MAX_GPU_UUID = 96
MAX_GPUS = 1024         # GPUs (MIG instances included) of one node's inventory or one job event
MAX_JOB_ID = 64
MAX_USER = 64
MAX_STEP_ID = 32
MAX_KEY = 64            # a training metric's name, a health counter's policy or kind
MAX_KEYS = 64           # keys of one such map
MAX_HEALTH_KIND = 64
# descriptions: cut to these
MAX_GPU_NAME = 128
MAX_GPU_SERIAL = 64  # NVML_DEVICE_SERIAL_BUFFER_SIZE is 30
MAX_COMMAND = 256
MAX_MAPPED_BY = 32
MAX_STATE = 4
MAX_WCHAN = 64
MAX_GPU_INDEXES = 256
MAX_HEALTH_TEXT = 512
MAX_HEALTH_PROCESS = 256
MAX_PCI = 32
MAX_PORT_NAME = 64      # a fabric port's device, speed or link layer (mlx5_0, HDR, InfiniBand)
MAX_TMPFS_USES = 4096   # users with files in one tmpfs walk


class HelloRefused(ValueError):
    """A Hello with a field past its bound; str() is the one line the agent is told."""


def _name_error(value: str, field: str, bound: int, printable: bool = False) -> str | None:
    if len(value) > bound:
        return f"{field} is {len(value)} characters long; at most {bound}"
    if printable and not value.isprintable():
        return f"{field} holds control characters"
    return None


def hello_refusal(hello: agent_pb2.Hello) -> str | None:
    """Why a Hello is refused (one line, without the offending value), or None; its GPUs' product names are
    cut in place."""
    if not hello.node:
        return "hello without a node name"
    problem = (_name_error(hello.node, "the node name", MAX_NODE, printable=True)
               or _name_error(hello.boot_id, "the boot id", MAX_BOOT_ID, printable=True)
               or _name_error(hello.agent_version, "the agent version", MAX_VERSION, printable=True)
               or _name_error(hello.gpu_source, "the GPU source", MAX_GPU_SOURCE, printable=True))
    if problem is None and len(hello.gpus) > MAX_GPUS:
        problem = f"the hello names {len(hello.gpus)} GPUs; at most {MAX_GPUS}"
    for g in hello.gpus if problem is None else ():
        problem = (_name_error(g.uuid, "a GPU's UUID", MAX_GPU_UUID)
                   or _name_error(g.parent_uuid, "a GPU's parent UUID", MAX_GPU_UUID))
        if problem is not None:
            break
        if len(g.name) > MAX_GPU_NAME:
            g.name = g.name[:MAX_GPU_NAME]
        if len(g.serial) > MAX_GPU_SERIAL or not g.serial.isprintable():
            g.serial = ""  # an identity the agent could not vouch for: the GPU is kept by its UUID
    return None if problem is None else f"hello refused: {problem}"


def check_hello(hello: agent_pb2.Hello) -> None:
    """Raise HelloRefused when a Hello may not be taken (see hello_refusal); cuts its GPU names in place."""
    problem = hello_refusal(hello)
    if problem is not None:
        raise HelloRefused(problem)


def _too_long(what: str, bound: int) -> Refusal:
    return Refusal("too_long", f"{what} is longer than {bound} characters")


def _keys_refusal(keys, what: str) -> Refusal | None:
    if len(keys) > MAX_KEYS:
        return Refusal("too_long", f"{what} has {len(keys)} keys; at most {MAX_KEYS}")
    if any(len(k) > MAX_KEY for k in keys):
        return _too_long(f"a key of {what}", MAX_KEY)
    return None


def bound_batch(batch: agent_pb2.Batch) -> Refusal | None:
    """Cut the batch's descriptions in place; a Refusal when one of its names is past its bound."""
    table = batch.processes
    if any(len(u) > MAX_GPU_UUID for u in table.gpu_uuids):
        return _too_long("a process's GPU UUID", MAX_GPU_UUID)
    for lab in table.label_sets:
        if len(lab.job_id) > MAX_JOB_ID:
            return _too_long("a process's job id", MAX_JOB_ID)
        if len(lab.user) > MAX_USER:
            return _too_long("a process's user name", MAX_USER)
        if len(lab.step_id) > MAX_STEP_ID:
            return _too_long("a process's step id", MAX_STEP_ID)
        if len(lab.command) > MAX_COMMAND:
            lab.command = lab.command[:MAX_COMMAND]
        if len(lab.mapped_by) > MAX_MAPPED_BY:
            lab.mapped_by = lab.mapped_by[:MAX_MAPPED_BY]
    for s in table.states:
        if len(s.state) > MAX_STATE:
            s.state = s.state[:MAX_STATE]
        if len(s.wchan) > MAX_WCHAN:
            s.wchan = s.wchan[:MAX_WCHAN]
    for g in batch.gpus:
        if len(g.uuid) > MAX_GPU_UUID:
            return _too_long("a GPU reading's UUID", MAX_GPU_UUID)
    for t in batch.training:
        refusal = _keys_refusal(t.metrics, "a training report's metrics")
        if refusal is not None:
            return refusal
        if any(len(a.gpu_uuid) > MAX_GPU_UUID for a in t.gpu_memory):
            return _too_long("a training report's GPU UUID", MAX_GPU_UUID)
        # tags: bounded by key and value where the state takes them (state.MAX_TAG_*), counted as dropped
    for e in batch.job_events:
        if len(e.job_id) > MAX_JOB_ID:
            return _too_long("a job event's job id", MAX_JOB_ID)
        if len(e.user) > MAX_USER:
            return _too_long("a job event's user name", MAX_USER)
        if len(e.gpu_uuids) > MAX_GPUS or any(len(u) > MAX_GPU_UUID for u in e.gpu_uuids):
            return _too_long("a job event's GPU list", MAX_GPU_UUID)
        if len(e.gpu_indexes) > MAX_GPU_INDEXES:
            e.gpu_indexes = e.gpu_indexes[:MAX_GPU_INDEXES]
    for h in batch.health_events:
        if len(h.uuid) > MAX_GPU_UUID or len(h.kind) > MAX_HEALTH_KIND or len(h.kernel_boot_id) > MAX_BOOT_ID:
            return _too_long("a health event's GPU UUID, kind or boot id", MAX_GPU_UUID)
        if len(h.text) > MAX_HEALTH_TEXT:
            h.text = h.text[:MAX_HEALTH_TEXT]
        if len(h.process) > MAX_HEALTH_PROCESS:
            h.process = h.process[:MAX_HEALTH_PROCESS]
        if len(h.pci) > MAX_PCI:
            h.pci = h.pci[:MAX_PCI]
        if len(h.device) > MAX_PORT_NAME:
            h.device = h.device[:MAX_PORT_NAME]
    for gh in batch.gpu_health:
        if len(gh.uuid) > MAX_GPU_UUID:
            return _too_long("a GPU health reading's UUID", MAX_GPU_UUID)
        refusal = (_keys_refusal(gh.violation_seconds, "a GPU health reading's violation times")
                   or _keys_refusal(gh.nvlink_errors, "a GPU health reading's NVLink errors"))
        if refusal is not None:
            return refusal
    for scan in batch.tmpfs_scans:  # one entry per uid with files: a node has a few; the rest are not kept
        if len(scan.uses) > MAX_TMPFS_USES:
            del scan.uses[MAX_TMPFS_USES:]
        for u in scan.uses:
            if len(u.user) > MAX_USER:
                return _too_long("a tmpfs use's user name", MAX_USER)
    for fp in batch.fabric_ports:
        if max(len(fp.device), len(fp.speed), len(fp.link_layer)) > MAX_PORT_NAME:
            return _too_long("a fabric port's device, speed or link layer", MAX_PORT_NAME)
        refusal = _keys_refusal(fp.counters, "a fabric port's counters")
        if refusal is not None:
            return refusal
    return None
