"""MIG: a GPU's health is its slices' health.

A GPU's health records (XIDs, ECC errors, a GPU lost, throttling) name the whole GPU (GpuHealth.uuid, and the
driver's XIDs are the board's), while the jobs on its MIG instances hold MIG-… UUIDs. The agent names each
instance's parent in its inventory (GpuInfo.parent_uuid, from the hello); these map between the two, so that
a finding on the whole GPU reaches the jobs on its slices (their stall's cause, status's health section)
and the processes on its slices are its users.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["with_parents", "slices_of", "gpu_index", "gpu_serial"]


def with_parents(state: Any, gpus: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
    """`gpus` ((node, UUID) pairs) and the whole GPU of each MIG instance among them."""
    out = set(gpus)
    known = state.gpus
    for node, uuid in list(out):
        gs = known.get(uuid)
        if gs is not None and gs.info.parent_uuid:
            out.add((node, gs.info.parent_uuid))
    return out


def slices_of(state: Any, node: str, uuid: str) -> frozenset[str]:
    """The MIG instances of `node`'s GPU `uuid` (its inventory as the agent last said it); empty for a GPU
    not in MIG mode."""
    ns = state.nodes.get(node)
    if ns is None:
        return frozenset()
    known = state.gpus
    return frozenset(u for u in ns.gpus if (gs := known.get(u)) is not None and gs.info.parent_uuid == uuid)


def gpu_index(state: Any, node: str, uuid: str) -> int | None:
    """The index of a GPU for display: its own, or, for a whole GPU in MIG mode (not in the inventory: its
    instances are), that of its instances (theirs is the parent's)."""
    gs = state.gpus.get(uuid)
    if gs is not None:
        return gs.info.index
    for u in slices_of(state, node, uuid):
        return state.gpus[u].info.index
    return None


def gpu_serial(state: Any, node: str, uuid: str) -> str:
    """The board serial of `node`'s GPU `uuid` as its agent said it ("" unknown): its own, or, for a whole GPU
    in MIG mode (not in the inventory: its instances are), that its instances carry."""
    gs = state.gpus.get(uuid)
    if gs is not None:
        return gs.info.serial
    known = state.gpus
    return next((s for u in slices_of(state, node, uuid) if (s := known[u].info.serial)), "")
