"""What the lab looks like: devices, their logs, hosts, network finds, the audit log. Reads only."""
from __future__ import annotations

from typing import Any

from device_loop.core import FLASH_KIND
from device_loop.core.durations import iso

from device_loop.core.vocabulary import DeviceState

from device_loop.core.answers import (AuditEntry, CandidateAnswer, DeviceAnswer, HostAnswer, LogEntry,
                                      RunningOperation, RunningStep)
from device_loop.core.errors import ErrorCode
from device_loop.core.suggestions import MAX_COMPARED, did_you_mean
from .errors import APIError
from .hidden_paths import hide_paths, hide_paths_in
from .holders import holder_json
from .lifecycle import Lifecycle, switched_off
from .quarantine import decoded, quarantine_answer, summary
from .rows import DeviceFacts
from .store import Store
from .who import Who
from .store.audit import AuditQueries
from .store.devices import DeviceQueries
from .store.hosts import HostQueries
from .store.operations import OperationQueries

SHOWN_HOLDERS = 3  # named in an admin's reason; the rest are counted (its page lists them all)


def device_json(row: DeviceFacts, in_full: bool = False) -> DeviceAnswer:
    """A device as anyone sees it: how many other processes hold its node, never which
    (``in_full``, for a caller that may see all: who they are — pid, program, command line,
    cgroup —, the id of its live lease, to act on it, and the exporter's file paths in its
    reasons)."""
    step = running_step(row)
    shown = (lambda text: text) if in_full else hide_paths_in
    quarantine = decoded(row["quarantine"])
    answer: DeviceAnswer = {
        "name": row["name"],
        "class": row["class"],
        "tags": row["tags"],
        "state": row["state"],
        "state_since": iso(row["state_since"]),  # when it entered that state
        "host": row["host"],
        "holder": row["holder"],
        "expires_at": iso(row["expires_at"]),
        "health": row["health"],
        "health_reason": shown(row["health_reason"]),
        # its owner first, then a host that claims it too (the owner keeps serving it)
        "conflict_hosts": [row["host"] or "", row["conflict_host"]] if row["conflict_host"] else [],
        "busy_count": len(row["busy_by"]),  # who they are is an admin's to see: other people's processes
        "resources": [{**r, "reason": shown(r["reason"])} if r.get("reason") else r for r in row["resources"]],
        # a failed destructive operation left it half-changed: no lease until it is recovered
        "needs_recovery": row["needs_recovery"] is not None,
        "recovery_reason": shown(row["needs_recovery"]),
        "operation": running_operation(row["op_id"], row["op_kind"]),
        "flashing": row["op_id"] if row["op_kind"] == FLASH_KIND else None,
        "steps": [s["step"] for s in row["steps"]],
        "step": step,
        "fault": shown(row["fault"]),
        "switched_off": switched_off(row["fault"], row["fault_kind"]),
        "fault_kind": row["fault_kind"],
        "quarantine": quarantine_answer(quarantine, shown) if quarantine else None,
        "fidelity": row["fidelity"],  # a board, a simulation, a virtual machine or an emulator
        "reason": shown(state_reason(row, step, in_full)),
        "facts": row.get("facts") or {},  # what its plugins add to its fingerprint
    }
    if in_full:
        answer["lease"] = row["lease_id"]
        answer["busy_by"] = [holder_json(h, in_full) for h in row["busy_by"]]
    return answer


def running_step(device: DeviceFacts) -> RunningStep | None:
    """The step a device runs now, while it is reclaimed."""
    index, steps = device["reclaim_step"], device["steps"]
    if index is None or index >= len(steps):
        return None
    detail = device["op_detail"] or "" if device["op_id"] == device["reclaim_op"] else ""
    return {"index": index, "of": len(steps), "step": steps[index]["step"], "op": device["reclaim_op"],
            "detail": detail}


def state_reason(row: DeviceFacts, step: RunningStep | None, in_full: bool = False) -> str:
    """Why a device is in its state, in words, where that is not plain: the step it runs
    while reclaimed, the processes that still hold it (which ones, ``in_full`` only), the
    fault or health that makes it faulty."""
    if row["state"] == DeviceState.RECLAIMING:
        if step is not None:
            where = step["detail"] or ("queued" if row["op_id"] == step["op"] else "starting")
            return f"step {step['index'] + 1}/{step['of']} {step['step']}: {where}"
        if row["busy_by"]:  # (docs/architecture.md, "Lifecycle": an orphan keeps it reclaiming)
            held = held_by(row["busy_by"], in_full)
            return f"still held after its lease by {held}: reclaimed once they end (or an admin has them killed)"
        return "waiting for its exporter to stop the last lease's services"
    if row["state"] == DeviceState.FAULTY:
        quarantine = decoded(row["quarantine"])
        return row["fault"] or (summary(quarantine) if quarantine else None) or row["health_reason"] or \
            "health check failed"
    return switched_off(row["fault"], row["fault_kind"]) or ""  # (its holder switched it off, and holds it still)


def held_by(holders: list[dict[str, Any]], in_full: bool) -> str:
    """Who still holds a device's node, in words: pid and program of the first few for a
    caller that may see all; how many, and that an admin sees which, for anyone else."""
    if not in_full:
        return f"{len(holders)} process{'es' if len(holders) != 1 else ''} (an admin sees which on its page)"
    held = ", ".join(f"pid {h['pid']} ({h['program']})" for h in map(holder_json, holders[:SHOWN_HOLDERS]))
    return held + (f" and {len(holders) - SHOWN_HOLDERS} more" if len(holders) > SHOWN_HOLDERS else "")


def running_operation(op_id: str | None, kind: str | None) -> RunningOperation | None:
    return {"id": op_id, "kind": kind} if op_id and kind else None


class Devices:
    """The board and what stands behind it."""

    def __init__(self, life: Lifecycle, *,
                 devices_sql: DeviceQueries, hosts_sql: HostQueries, operations_sql: OperationQueries,
                 audit_sql: AuditQueries):
        self.life = life
        self.store: Store = life.store
        self.devices_sql = devices_sql
        self.hosts_sql = hosts_sql
        self.operations_sql = operations_sql
        self.audit_sql = audit_sql

    async def list_devices(self) -> list[DeviceAnswer]:
        return [device_json(d) for d in await self.devices_sql.devices()]

    async def facts(self, name: str) -> DeviceFacts | None:
        """A device's row with its facts (its steps among them), or None."""
        return await self.devices_sql.device(name)

    async def device_info(self, name: str, who: Who | None = None) -> DeviceAnswer:
        """A device as ``who`` sees it (in full if it may see all)."""
        row = await self.devices_sql.device(name)
        if row is None:
            raise await self.unknown(name)
        answer = device_json(row, who is not None and who.may_see_all)
        answer["image"] = await self.operations_sql.last_flashed_image(name)
        return answer

    async def device_log(self, name: str, who: Who | None = None) -> list[LogEntry]:
        """A device's ring log, newest last (the exporter's file paths in it: only for a ``who``
        that may see all)."""
        in_full = who is not None and who.may_see_all
        if await self.devices_sql.device(name) is None:
            raise await self.unknown(name)
        return [{"at": iso(e["at"]), "from": e["from_state"], "to": e["to_state"],
                 "cause": e["cause"] if in_full else hide_paths(e["cause"]), "actor": e["actor"]}
                for e in await self.devices_sql.device_log(name)]

    async def unknown(self, name: str) -> APIError:
        """The refusal for a device name nobody knows, with some that exist."""
        names = await self.devices_sql.device_names(MAX_COMPARED)
        hint = f"; known devices: {', '.join(names[:10])}" + (", ..." if len(names) > 10 else "") if names \
            else "; no device is registered yet"
        return APIError(404, ErrorCode.UNKNOWN_DEVICE, f"unknown device {name!r}{did_you_mean(name, names)}{hint} (a "
                                                       "configured device that no plugin serves is listed by "
                                                       "'device-loop hosts')")

    async def hosts(self, only: str | None = None) -> list[HostAnswer]:
        now = self.life.clock()
        devices: dict[str, list[str]] = {}
        claims: dict[str, list[str]] = {}
        for row in await self.devices_sql.device_hosts():
            devices.setdefault(row["host"], []).append(row["name"])
            if row["conflict_host"]:
                claims.setdefault(row["conflict_host"], []).append(row["name"])
        return [{
            "name": h["name"], "online": h["online"], "protocol": h["protocol"],
            "version": h["version"], "boot_id": h["boot_id"], "generation": h["generation"],
            "heartbeat_s": h["heartbeat_s"], "heartbeat_age_s": round(now - h["last_seen"], 1),
            "draining": h["draining"], "last_seen": iso(h["last_seen"]), "plugins": h["plugins"],
            "link_lost": h["link_lost"],  # its long-poll was cut: up again at its next heartbeat
            "address": h["address"],  # its own, as its exporter reports it: where its endpoints are
            "devices": devices.get(h["name"], []),
            "claims": claims.get(h["name"], []),  # devices it reports that another host owns
        } for h in await self.hosts_sql.hosts() if only in (None, h["name"])]

    async def host_address(self, name: str) -> str | None:
        """The address host ``name``'s exporter reported as its own (None: it did not say)."""
        host = await self.hosts_sql.host(name)
        return host["address"] if host else None

    async def candidates(self) -> list[CandidateAnswer]:
        """What exporters found on the network and nobody adopted yet (and what they did)."""
        return [{"identifier": c["identifier"], "host": c["host"], "kind": c["kind"], "plugin": c["plugin"],
                 "label": c["label"], "last_seen": iso(c["last_seen"]), "adopted_as": c["adopted_as"]}
                for c in await self.hosts_sql.candidates()]

    async def audit(self, limit: int = 100) -> list[AuditEntry]:
        return [{"at": iso(a["at"]), "actor": a["actor"], "action": a["action"], "device": a["device"],
                 "lease": a["lease_id"], "detail": a["detail"]} for a in await self.audit_sql.audit(limit)]
