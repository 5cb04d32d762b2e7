"""All SQL of the coordinator, in one place. Rules live in ``rules.py``, not here."""
from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import databases

from .migrations import MIGRATIONS, SERIAL

LIVE = ("pending", "active")
_JSON_COLUMNS = {"tags", "plugins", "services", "superseded_boots", "busy_by", "detail"}
_BOOL_COLUMNS = {"online", "present", "retired", "admin", "draining"}


class UniqueViolation(Exception):
    """An INSERT hit a UNIQUE constraint (on SQLite or PostgreSQL)."""


def _is_unique_violation(exc: Exception) -> bool:
    """sqlite3 / aiosqlite, asyncpg and psycopg each name it their own way."""
    name = type(exc).__name__
    return name == "IntegrityError" and "UNIQUE" in str(exc).upper() or name in ("UniqueViolationError", "UniqueViolation")


def _row(record) -> dict[str, Any] | None:
    if record is None:
        return None
    row = dict(record._mapping)
    for key in row.keys() & _JSON_COLUMNS:
        if row[key] is not None:
            row[key] = json.loads(row[key])
    for key in row.keys() & _BOOL_COLUMNS:
        row[key] = bool(row[key])
    return row


def _encode(values: dict[str, Any]) -> dict[str, Any]:
    return {k: json.dumps(v) if k in _JSON_COLUMNS else v for k, v in values.items()}


class Store:
    def __init__(self, url: str):
        self.url = url
        self.dialect = "postgresql" if url.startswith(("postgres", "postgresql")) else "sqlite"
        options = {"timeout": 30} if self.dialect == "sqlite" else {}
        self.db = databases.Database(url, **options)
        # SQLite allows one writer: queue writers here instead of failing with
        # "database is locked". Exclusivity itself is the UNIQUE index's job.
        self._write_lock = asyncio.Lock() if self.dialect == "sqlite" else None

    async def connect(self) -> None:
        await self.db.connect()
        if self.dialect == "sqlite":
            await self.db.execute("PRAGMA journal_mode=WAL")
        await self._migrate()

    async def disconnect(self) -> None:
        await self.db.disconnect()

    async def _migrate(self) -> None:
        await self.db.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY)")
        done = {r["version"] for r in await self.db.fetch_all("SELECT version FROM schema_migrations")}
        for version, statements in enumerate(MIGRATIONS, start=1):
            if version in done:
                continue
            async with self.tx():
                for sql in statements:
                    await self.db.execute(sql.format(serial=SERIAL[self.dialect]))
                await self.db.execute("INSERT INTO schema_migrations (version) VALUES (:v)", {"v": version})

    @contextlib.asynccontextmanager
    async def tx(self):
        """One transaction; every rule that writes runs inside one."""
        lock = self._write_lock or contextlib.nullcontext()
        async with lock:
            async with self.db.transaction():
                yield

    async def _all(self, sql: str, **values) -> list[dict]:
        return [_row(r) for r in await self.db.fetch_all(sql, values)]

    async def _one(self, sql: str, **values) -> dict | None:
        return _row(await self.db.fetch_one(sql, values))

    async def _exec(self, sql: str, **values) -> None:
        await self.db.execute(sql, _encode(values))

    async def _insert(self, table: str, row: dict[str, Any]) -> None:
        columns = ", ".join(row)
        params = ", ".join(f":{c}" for c in row)
        try:
            await self._exec(f"INSERT INTO {table} ({columns}) VALUES ({params})", **row)
        except Exception as exc:
            if _is_unique_violation(exc):
                raise UniqueViolation(str(exc)) from exc
            raise

    async def _update(self, table: str, key: str, key_value: Any, fields: dict[str, Any]) -> None:
        sets = ", ".join(f"{c} = :{c}" for c in fields)
        await self._exec(f"UPDATE {table} SET {sets} WHERE {key} = :_key", _key=key_value, **fields)

    # hosts
    async def host(self, name: str) -> dict | None:
        return await self._one("SELECT * FROM hosts WHERE name = :name", name=name)

    async def hosts(self) -> list[dict]:
        return await self._all("SELECT * FROM hosts ORDER BY name")

    async def save_host(self, row: dict) -> None:
        if await self.host(row["name"]) is None:
            await self._insert("hosts", row)
        else:
            await self._update("hosts", "name", row["name"], {k: v for k, v in row.items() if k != "name"})

    async def hosts_silent_since(self, now: float, periods: float, minimum: float) -> list[str]:
        rows = await self._all(
            "SELECT name FROM hosts WHERE online AND last_seen < :now - "
            "CASE WHEN heartbeat_s * :periods > :minimum THEN heartbeat_s * :periods ELSE :minimum END",
            now=now, periods=periods, minimum=minimum)
        return [r["name"] for r in rows]

    async def set_host_draining(self, name: str, draining: bool) -> None:
        await self._exec("UPDATE hosts SET draining = :d WHERE name = :name", d=draining, name=name)

    async def set_host_offline(self, name: str) -> None:
        await self._exec("UPDATE hosts SET online = :off WHERE name = :name", off=False, name=name)

    # devices and resources
    async def device(self, name: str) -> dict | None:
        return await self._one("SELECT * FROM devices WHERE name = :name", name=name)

    async def devices(self) -> list[dict]:
        """Every device with its live lease's holder and expiry (public facts)."""
        return await self._all(
            "SELECT d.*, l.holder AS holder, l.expires_at AS expires_at FROM devices d "
            "LEFT JOIN leases l ON l.device = d.name AND l.state IN ('pending', 'active') "
            "ORDER BY d.name")

    async def devices_of_host(self, host: str) -> list[dict]:
        return await self._all("SELECT * FROM devices WHERE host = :host ORDER BY name", host=host)

    async def devices_claimed_by(self, host: str) -> list[dict]:
        return await self._all("SELECT * FROM devices WHERE conflict_host = :host", host=host)

    async def insert_device(self, row: dict) -> None:
        await self._insert("devices", row)

    async def update_device(self, name: str, **fields) -> None:
        await self._update("devices", "name", name, fields)

    async def resources(self) -> list[dict]:
        return await self._all("SELECT * FROM resources ORDER BY device, kind, identifier")

    async def resources_of(self, device: str) -> list[dict]:
        return await self._all("SELECT * FROM resources WHERE device = :d ORDER BY kind, identifier", d=device)

    async def resource(self, identifier: str) -> dict | None:
        return await self._one("SELECT * FROM resources WHERE identifier = :i", i=identifier)

    async def replace_resources(self, device: str, rows: list[dict]) -> None:
        """Give ``device`` exactly these resources, taking identifiers from other devices."""
        await self._exec("DELETE FROM resources WHERE device = :d", d=device)
        for row in rows:
            await self._exec("DELETE FROM resources WHERE identifier = :i", i=row["identifier"])
            await self._insert("resources", {**row, "device": device})

    # leases
    async def insert_lease(self, row: dict) -> None:
        await self._insert("leases", row)

    async def lease(self, lease_id: str) -> dict | None:
        return await self._one("SELECT * FROM leases WHERE id = :id", id=lease_id)

    async def live_lease_of(self, device: str) -> dict | None:
        return await self._one(
            "SELECT * FROM leases WHERE device = :d AND state IN ('pending', 'active')", d=device)

    async def live_leases_of_holder(self, holder: str) -> list[dict]:
        return await self._all(
            "SELECT * FROM leases WHERE holder = :h AND state IN ('pending', 'active') ORDER BY created_at",
            h=holder)

    async def live_leases_on_host(self, host: str) -> list[dict]:
        return await self._all(
            "SELECT l.* FROM leases l JOIN devices d ON d.name = l.device "
            "WHERE d.host = :host AND d.present AND NOT d.retired AND l.state IN ('pending', 'active') "
            "ORDER BY l.id", host=host)

    async def leases_past(self, column: str, states: tuple[str, ...], before: float) -> list[dict]:
        marks = ", ".join(f"'{s}'" for s in states)
        return await self._all(
            f"SELECT * FROM leases WHERE state IN ({marks}) AND {column} < :before", before=before)

    async def end_lease(self, lease_id: str, state: str, reason: str, now: float) -> bool:
        """Move a live lease to a final state; False if it was no longer live (here or in
        another coordinator process)."""
        ended = await self.db.fetch_one(
            "UPDATE leases SET state = :state, end_reason = :reason, ended_at = :now "
            "WHERE id = :id AND state IN ('pending', 'active') RETURNING id",
            {"state": state, "reason": reason, "now": now, "id": lease_id})
        return ended is not None

    async def activate_lease(self, lease_id: str) -> None:
        await self._exec("UPDATE leases SET state = 'active' WHERE id = :id AND state = 'pending'", id=lease_id)

    async def set_lease_expiry(self, lease_id: str, expires_at: float) -> None:
        await self._exec("UPDATE leases SET expires_at = :e WHERE id = :id", e=expires_at, id=lease_id)

    # logs
    async def add_device_log(self, row: dict, keep: int) -> None:
        await self._insert("device_log", row)
        await self._exec(
            "DELETE FROM device_log WHERE device = :d AND id NOT IN "
            "(SELECT id FROM device_log WHERE device = :d ORDER BY id DESC LIMIT :keep)",
            d=row["device"], keep=keep)

    async def device_log(self, device: str) -> list[dict]:
        return await self._all("SELECT * FROM device_log WHERE device = :d ORDER BY id", d=device)

    async def add_audit(self, row: dict) -> None:
        await self._insert("audit", row)

    async def audit(self, limit: int = 100) -> list[dict]:
        return await self._all("SELECT * FROM audit ORDER BY id DESC LIMIT :n", n=limit)

    # idempotency keys
    # These run on their own, outside any rule's transaction.
    async def claim_idempotency_key(self, caller: str, key: str, request: str, now: float) -> dict | None:
        """Claim ``key`` for a new request; return the existing row if it was claimed before."""
        try:
            async with self.tx():
                await self._insert("idempotency", {"caller": caller, "key": key, "request": request,
                                                   "status": None, "body": None, "created_at": now})
            return None
        except UniqueViolation:
            return await self._one("SELECT * FROM idempotency WHERE caller = :c AND key = :k", c=caller, k=key)

    async def finish_idempotency_key(self, caller: str, key: str, status: int, body: str) -> None:
        async with self.tx():
            await self._exec("UPDATE idempotency SET status = :s, body = :b WHERE caller = :c AND key = :k",
                             s=status, b=body, c=caller, k=key)

    async def drop_idempotency_key(self, caller: str, key: str) -> None:
        async with self.tx():
            await self._exec("DELETE FROM idempotency WHERE caller = :c AND key = :k", c=caller, k=key)

    async def drop_idempotency_keys_before(self, before: float) -> None:
        await self._exec("DELETE FROM idempotency WHERE created_at < :t", t=before)

    # API tokens (only their hashes are stored)
    async def insert_token(self, row: dict) -> None:
        async with self.tx():
            await self._insert("tokens", row)

    async def token_by_hash(self, digest: str) -> dict | None:
        return await self._one("SELECT * FROM tokens WHERE hash = :h", h=digest)

    async def tokens(self) -> list[dict]:
        return await self._all("SELECT * FROM tokens ORDER BY created_at")

    async def revoke_token(self, token_id: str, now: float) -> bool:
        async with self.tx():
            done = await self.db.fetch_one(
                "UPDATE tokens SET revoked_at = :now WHERE id = :id AND revoked_at IS NULL RETURNING id",
                {"now": now, "id": token_id})
        return done is not None

    # network candidates and adoptions
    async def save_candidate(self, row: dict) -> None:
        if await self._one("SELECT identifier FROM candidates WHERE identifier = :i", i=row["identifier"]):
            await self._update("candidates", "identifier", row["identifier"],
                               {k: v for k, v in row.items() if k != "identifier"})
        else:
            await self._insert("candidates", row)

    async def candidates(self) -> list[dict]:
        return await self._all(
            "SELECT c.*, a.name AS adopted_as FROM candidates c LEFT JOIN adoptions a ON a.identifier = c.identifier "
            "ORDER BY c.host, c.identifier")

    async def candidate(self, identifier: str) -> dict | None:
        return await self._one("SELECT * FROM candidates WHERE identifier = :i", i=identifier)

    async def insert_adoption(self, row: dict) -> None:
        await self._insert("adoptions", row)

    async def adoptions_on_host(self, host: str) -> list[dict]:
        return await self._all("SELECT * FROM adoptions WHERE host = :h ORDER BY identifier", h=host)
