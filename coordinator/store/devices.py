"""The statements on the devices table, its ring logs and the identifiers each device owns
(``resources``). A device's facts are what every rule decides on: hence the services it is
lent to. Who may use them: ``OWNERS`` and ``LENT_TO``
(docs/architecture.md, "A service reaches only its tables")."""
from __future__ import annotations

import json
from typing import Any, Literal, overload

from device_loop.core.vocabulary import DeviceState, sql_list

from ..rows import DeviceFacts, RingRow
from .core import RING_SLOTS, Store
from .facts import DEVICE_FACTS, FREE, RUNNING_FIRST, VIRTUAL_FIRST

# the coordinator modules whose tables these are, and those handed them besides (in rules.py)
OWNERS = ("lifecycle.py", "hosts.py")
LENT_TO = ("devices.py", "leases.py", "images.py", "operations.py", "scheduler.py", "steps.py", "power.py", "admin.py",
           "jobs.py")

_NOT_SERVING = sql_list((DeviceState.FAULTY, DeviceState.OFFLINE))

DEVICE_COLUMNS = ("name", "class", "tags", "host", "state", "present", "health", "health_reason", "conflict_host",
                  "reclaim_lease", "busy_by", "retired", "created_at", "updated_at", "resources", "report_digest",
                  "log_seq", "state_since", "steps", "facts", "fidelity", "quarantine")


class DeviceQueries:
    """The statements on devices, their ring logs and their identifiers."""

    def __init__(self, db: Store):
        self.db = db

    async def device(self, name: str) -> DeviceFacts | None:
        """A device with its facts."""
        return await self.db.row(f"{DEVICE_FACTS} WHERE d.name = :name", name=name)

    async def devices(self) -> list[DeviceFacts]:
        """Every device with its facts (the holder and expiry of a live lease are public)."""
        return await self.db.rows(f"{DEVICE_FACTS} ORDER BY d.name")

    async def device_names(self, limit: int) -> list[str]:
        return [r["name"] for r in await self.db.rows("SELECT name FROM devices ORDER BY name LIMIT :n", n=limit)]

    async def device_classes(self) -> list[str]:
        return [r["class"] for r in await self.db.rows("SELECT DISTINCT class FROM devices ORDER BY class")]

    async def idle_device_of_class(self, device_class: str, other_than: str) -> str | None:
        row = await self.db.row("SELECT name FROM devices WHERE class = :c AND name <> :n AND state = 'idle' "
                                "AND needs_recovery IS NULL ORDER BY name LIMIT 1", c=device_class, n=other_than)
        return row["name"] if row else None

    @overload
    async def devices_of_host(self, host: str, in_transition_only: bool = False, *,
                              decode_json: Literal[True] = True) -> list[DeviceFacts]: ...

    @overload
    async def devices_of_host(self, host: str, in_transition_only: bool = False, *,
                              decode_json: Literal[False]) -> list[dict[str, Any]]: ...

    async def devices_of_host(self, host: str, in_transition_only: bool = False,
                              decode_json: bool = True) -> list[Any]:
        """The devices ``host`` owns or claims, with their facts; ``in_transition_only``: just
        those a report can move on (being reclaimed, or with a pending lease). Without
        ``decode_json``, JSON columns stay text (written back as they are)."""
        where = "(d.host = :host OR d.conflict_host = :host)"
        if in_transition_only:
            where += " AND (d.reclaim_lease IS NOT NULL OR l.state = 'pending')"
        return await self.db.rows(f"{DEVICE_FACTS} WHERE {where}", _decode_json=decode_json, host=host)

    async def report_digests(self, host: str) -> dict[str, str]:
        """Device name -> digest of its last report, for the devices ``host`` owns."""
        rows = await self.db.rows("SELECT name, report_digest FROM devices WHERE host = :host", host=host)
        return {r["name"]: r["report_digest"] for r in rows}

    async def devices_named(self, names: list[str]) -> list[DeviceFacts]:
        if not names:
            return []
        where, params = self.db.in_list("d.name", "names", names)
        return await self.db.rows(f"{DEVICE_FACTS} WHERE {where}", **params)

    async def device_hosts(self) -> list[dict]:
        return await self.db.rows("SELECT name, host, conflict_host FROM devices ORDER BY name")

    async def write_devices(self, rows: list[dict]) -> None:
        """Insert or update whole device rows (keys other than ``DEVICE_COLUMNS`` are facts, not
        columns); a claim by another host is that host's to write (``set_claims``)."""
        await self.db.insert_many("devices", [{c: row[c] for c in DEVICE_COLUMNS} for row in rows], upsert_key="name",
                                  kept=("conflict_host",))

    async def set_claims(self, host: str, names: list[str]) -> None:
        """``host`` reports ``names`` too, which other hosts own."""
        where, params = self.db.in_list("name", "names", names)
        await self.db.run(f"UPDATE devices SET conflict_host = :host WHERE {where}", host=host, **params)

    async def drop_claims(self, host: str, names: list[str] | None = None) -> None:
        """``host`` no longer reports ``names`` (default: any device) that other hosts own."""
        where, params = self.db.in_list("name", "names", names) if names is not None else ("TRUE", {})
        await self.db.run(f"UPDATE devices SET conflict_host = NULL WHERE conflict_host = :host AND {where}",
                          host=host, **params)

    async def update_device(self, name: str, **fields: Any) -> None:
        await self.db.update("devices", "name", name, fields)

    async def count_lab_failure(self, name: str, lab: bool) -> int | None:
        """Count a lab failure of ``name`` (``lab``) or set its count back to 0: the lab failures
        in a row it has now (None: no such device, or none to set back: nothing written)."""
        row = await self.db.row("UPDATE devices SET lab_failures = CASE WHEN :lab = 1 THEN lab_failures + 1 ELSE 0 END "
                                "WHERE name = :n AND (:lab = 1 OR lab_failures <> 0) RETURNING lab_failures",
                                lab=int(lab), n=name)
        return None if row is None else row["lab_failures"]

    async def update_device_logged(self, name: str, **fields: Any) -> int:
        """Update a device whose state changed; returns the sequence number of that change."""
        sets = ", ".join(f"{c} = :{c}" for c in fields)
        row = await self.db.row(f"UPDATE devices SET {sets}, log_seq = log_seq + 1 WHERE name = :_key "
                                "RETURNING log_seq", _key=name, **fields)
        return row["log_seq"]

    async def add_ring_entries(self, entries: list[dict]) -> None:
        """State changes (with their ``seq``) into each device's ring of ``RING_SLOTS``."""
        await self.db.insert_many("device_ring", [{**e, "slot": e["seq"] % RING_SLOTS} for e in entries],
                                  upsert_key="device, slot")

    async def device_log(self, device: str) -> list[RingRow]:
        return await self.db.rows("SELECT * FROM device_ring WHERE device = :d ORDER BY seq", d=device)

    async def identifier_owners(self, identifiers: list[str]) -> list[dict]:
        if not identifiers:
            return []
        where, params = self.db.in_list("r.identifier", "identifiers", identifiers)
        return await self.db.rows(
            "SELECT r.identifier, r.device, d.host, d.present, h.online AS host_online FROM resources r "
            f"JOIN devices d ON d.name = r.device LEFT JOIN hosts h ON h.name = d.host WHERE {where}", **params)

    async def replace_identities(self, devices: list[str], rows: list[dict]) -> None:
        """Give each of ``devices`` exactly its ``rows``, taking identifiers from other devices."""
        by_device, params = self.db.in_list("device", "devices", devices)
        by_identifier, more = self.db.in_list("identifier", "identifiers", [r["identifier"] for r in rows])
        await self.db.run(f"DELETE FROM resources WHERE {by_device} OR {by_identifier}", **params, **more)
        await self.db.insert_many("resources", rows)

    async def forget_devices(self, names: list[str]) -> None:
        """Delete devices with what is theirs alone: identifiers, ring logs, adoptions (a
        claim is a column of their row). Their leases, flashes and audit entries stay, as history."""
        by_device, params = self.db.in_list("device", "names", names)
        by_name, _ = self.db.in_list("name", "names", names)
        await self.db.run(f"DELETE FROM resources WHERE {by_device}", **params)
        await self.db.run(f"DELETE FROM device_ring WHERE {by_device}", **params)
        await self.db.run(f"DELETE FROM adoptions WHERE {by_name}", **params)
        await self.db.run(f"DELETE FROM devices WHERE {by_name}", **params)

    def _of_class_with_tags(self, device_class: str | None, tags: list[str],
                            fidelities: tuple[str, ...] | None = None, classes: tuple[str, ...] | None = None,
                            any_tags: tuple[str, ...] | None = None) -> tuple[str, dict[str, Any]]:
        """SQL (and its values): device ``d`` is of ``device_class`` (any: None) with all of
        ``tags``, and of one of ``fidelities`` (any: None); of one of ``classes`` and with one of
        ``any_tags`` at least, where given (a scoped token's pick: docs/architecture.md,
        "Shares of one lab")."""
        where = "TRUE" if fidelities is None else f"d.fidelity IN {sql_list(fidelities)}"
        values: dict[str, Any] = {}
        if device_class is not None:
            where += " AND d.class = :c"
            values["c"] = device_class
        if tags:
            where += " AND " + self.db.tags_within(":tags", "d.tags")
            values["tags"] = json.dumps(sorted(tags))
        if classes is not None:
            within, params = self.db.in_list("d.class", "scope_classes", list(classes))
            where += f" AND {within}"
            values |= params
        if any_tags is not None:
            where += " AND " + self.db.tags_overlap(":scope_tags", "d.tags")
            values["scope_tags"] = json.dumps(sorted(any_tags))
        return where, values

    async def free_devices_named(self, names: list[str]) -> list[DeviceFacts]:
        """Those of ``names`` that are free to lease (``_FREE``)."""
        where, params = self.db.in_list("d.name", "names", sorted(set(names)))
        return await self.db.rows(f"{DEVICE_FACTS} WHERE {FREE} AND {where} ORDER BY d.name", **params)

    async def free_devices(self, device_class: str | None, tags: list[str], limit: int,
                           fidelities: tuple[str, ...] | None = None, virtual_first: bool = False,
                           running: str | None = None, classes: tuple[str, ...] | None = None,
                           any_tags: tuple[str, ...] | None = None) -> list[DeviceFacts]:
        """Devices free to lease of ``device_class`` (any, if None) with every one of ``tags``
        and of one of ``fidelities`` (any, if None), idle the longest first (wear spreads over
        the class), the virtual ones before any other with ``virtual_first``, and before all
        those already running image ``running`` (a digest: ``RUNNING_FIRST``); of one of
        ``classes`` and one of ``any_tags`` where given (a scoped token's). Not locked: a
        lease is taken under its host's lock (``lock_hosts``), and the partial UNIQUE index decides."""
        where, values = self._of_class_with_tags(device_class, tags, fidelities, classes, any_tags)
        first = f"{VIRTUAL_FIRST}, " if virtual_first else ""
        if running is not None:
            first = f"{RUNNING_FIRST}, {first}"
            values["running"] = running
        return await self.db.rows(f"{DEVICE_FACTS} WHERE {FREE} AND {where} "
                                  f"ORDER BY {first}COALESCE(d.state_since, 0), d.name LIMIT :n", n=limit, **values)

    async def matching_devices(self, device_class: str | None, tags: list[str],
                               fidelities: tuple[str, ...] | None = None) -> list[str]:
        """The names of the devices of ``device_class`` (any) with all of ``tags`` and of one of
        ``fidelities`` (any), but retired ones: those that may serve soon (neither faulty nor
        offline) first."""
        where, values = self._of_class_with_tags(device_class, tags, fidelities)
        rows = await self.db.rows(f"SELECT d.name AS name FROM devices d WHERE {where} AND NOT d.retired ORDER BY "
                                  f"CASE WHEN d.state IN {_NOT_SERVING} THEN 1 ELSE 0 END, d.name", **values)
        return [r["name"] for r in rows]

    async def matching_device_states(self, device_class: str | None, tags: list[str],
                                     fidelities: tuple[str, ...] | None = None) -> dict[str, int]:
        """How many devices of ``device_class`` (any) with all of ``tags`` and of one of
        ``fidelities`` (any) are in each state."""
        where, values = self._of_class_with_tags(device_class, tags, fidelities)
        rows = await self.db.rows(f"SELECT d.state AS state, COUNT(*) AS n FROM devices d WHERE {where} "
                                  "GROUP BY d.state", **values)
        return {r["state"]: r["n"] for r in rows}
