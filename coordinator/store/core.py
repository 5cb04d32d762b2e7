"""The store's shared core: the connection, transactions, the statements' plumbing, the
dialect switches and the migrations. It holds no statement about any table: those are in
one query module per service (``hosts.py``, ``leases.py``, ...), each handed only to the
services that own those tables (docs/architecture.md, "A service reaches only its tables").

Every statement is counted (``Store.statements``; a batch of rows counts once): the tests
hold the heartbeat to a fixed number of statements whatever the number of devices.
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import sqlite3
from typing import Any, AsyncIterator, Callable, Mapping, Sequence

from device_loop.core.vocabulary import VOCABULARY

from ..migrations import MIGRATIONS, SERIAL
from .drivers import CHANNEL, Listener, PostgreSQL, SQLite

# A state is its text to the database. sqlite3 binds a plain str at once but looks a str
# subclass up as a type to adapt first; registered, it costs what a str does (a changed
# 1000-device heartbeat writes two of them a device: bench/fast_path.py, 1.5x its time).
for _enum in VOCABULARY:
    sqlite3.register_adapter(_enum, str.__str__)

RING_SLOTS = 20  # state changes each device keeps (docs/architecture.md, "Lifecycle")

_JSON_COLUMNS = {"tags", "plugins", "services", "superseded_boots", "busy_by", "detail", "resources", "host_services",
                 "seconds", "args", "result", "steps", "facts", "spec", "fingerprint", "readings", "samples"}
_BOOL_COLUMNS = {"online", "present", "retired", "admin", "draining", "host_online", "host_draining", "link_lost",
                 "host_link_lost", "exclusive", "destructive", "warmup", "interrupted", "budget_capped",
                 "token_counted"}


class UniqueViolation(Exception):
    """A write hit a UNIQUE constraint (on SQLite or PostgreSQL)."""


def _is_unique_violation(exc: Exception) -> bool:
    """sqlite3 and asyncpg each name it their own way."""
    name = type(exc).__name__
    return name == "IntegrityError" and "UNIQUE" in str(exc).upper() or name == "UniqueViolationError"


def _row(record: dict, decode_json: bool = True) -> dict[str, Any]:
    for key in record.keys() & _JSON_COLUMNS if decode_json else ():
        if record[key] is not None:
            record[key] = json.loads(record[key])
    for key in record.keys() & _BOOL_COLUMNS:
        record[key] = bool(record[key])
    return record


def _encode(values: Mapping[str, Any]) -> dict[str, Any]:
    """JSON columns as text (a value that is text already was read without decoding)."""
    return {k: json.dumps(v) if k in _JSON_COLUMNS and not isinstance(v, str) else v for k, v in values.items()}


class _Tx:
    def __init__(self) -> None:
        self.after_commit: list[Callable[[], None]] = []
        self.changed: set[str] = set()


_CURRENT_TX: contextvars.ContextVar[_Tx | None] = contextvars.ContextVar("device_loop_tx", default=None)


class Store:
    """One database: its connection, its transactions, its statements counted."""

    def __init__(self, url: str):
        self.url = url
        self.dialect = "postgresql" if url.startswith(("postgres", "postgresql")) else "sqlite"
        self.driver = PostgreSQL(url) if self.dialect == "postgresql" else SQLite(url.split("sqlite:///", 1)[1])
        # lock the host's row for the whole heartbeat (SQLite has one writer anyway)
        self.for_update = " FOR UPDATE" if self.dialect == "postgresql" else ""
        self.least = "LEAST" if self.dialect == "postgresql" else "MIN"  # the smaller of several values
        self.statements = 0
        self._heard: Callable[[set[str] | None], None] = lambda keys: None
        self._listener: Listener | None = None

    def in_list(self, column: str, param: str, values: list) -> tuple[str, dict[str, Any]]:
        """``column`` is one of ``values``, as one parameter (SQLite binds each named
        parameter in time linear in their number: 1000 of them took milliseconds)."""
        if self.dialect == "postgresql":
            return f"{column} = ANY(:{param})", {param: list(values)}
        return f"{column} IN (SELECT value FROM json_each(:{param}))", {param: json.dumps(list(values))}

    def rows_of(self, column: str, param: str) -> str:
        """The values of the list parameter ``param`` as rows of one ``column``."""
        if self.dialect == "postgresql":
            return f"SELECT unnest(CAST(:{param} AS TEXT[])) AS {column}"
        return f"SELECT value AS {column} FROM json_each(:{param})"

    def list_param(self, values: list) -> Any:
        """``values`` as one parameter that ``rows_of`` reads."""
        return list(values) if self.dialect == "postgresql" else json.dumps(list(values))

    def tags_within(self, wanted: str, having: str) -> str:
        """SQL: every tag of the JSON list ``wanted`` is in the JSON list ``having``."""
        if self.dialect == "postgresql":
            return f"CAST({wanted} AS jsonb) <@ CAST({having} AS jsonb)"
        return (f"NOT EXISTS (SELECT 1 FROM json_each({wanted}) w WHERE w.value NOT IN "
                f"(SELECT value FROM json_each({having})))")

    def tags_overlap(self, wanted: str, having: str) -> str:
        """SQL: one tag at least of the JSON list ``wanted`` is in the JSON list ``having``."""
        if self.dialect == "postgresql":
            return (f"jsonb_exists_any(CAST({having} AS jsonb), "
                    f"ARRAY(SELECT jsonb_array_elements_text(CAST({wanted} AS jsonb))))")
        return f"EXISTS (SELECT 1 FROM json_each({having}) h WHERE h.value IN (SELECT value FROM json_each({wanted})))"

    async def connect(self) -> None:
        """Open the database, bring its tables to the latest migration, and (PostgreSQL)
        listen for the commits of other coordinator processes."""
        await self.driver.connect()
        await self._migrate()
        if self.dialect == "postgresql":
            self._listener = Listener(self.url, lambda keys: self._heard(keys))
            await self._listener.open()

    async def disconnect(self) -> None:
        """Close the channel and the connections."""
        if self._listener:
            await self._listener.close()
        await self.driver.disconnect()

    async def _migrate(self) -> None:
        await self.run("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY)")
        done = {r["version"] for r in await self.rows("SELECT version FROM schema_migrations")}
        for version, statements in enumerate(MIGRATIONS, start=1):
            if version in done:
                continue
            async with self.tx():
                for step in statements:
                    sql = step.get(self.dialect) if isinstance(step, dict) else step
                    if sql is not None:
                        await self.run(sql.format(serial=SERIAL[self.dialect], ring=RING_SLOTS))
                await self.run("INSERT INTO schema_migrations (version) VALUES (:v)", v=version)

    # ---- transactions -------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def tx(self) -> AsyncIterator[None]:
        """One transaction. A ``tx()`` inside another joins it: all commits or nothing does."""
        if _CURRENT_TX.get() is not None:
            yield
            return
        current = _Tx()
        token = _CURRENT_TX.set(current)
        try:
            async with self.driver.transaction():
                yield
                if current.changed:
                    await self._publish(current)
        finally:
            _CURRENT_TX.reset(token)
        for callback in current.after_commit:
            callback()

    def subscribe(self, heard: Callable[[set[str] | None], None]) -> None:
        """Call ``heard(keys)`` whenever a transaction that ``changed(keys)`` commits, in any
        coordinator process on this database; ``heard(None)``: anything may have changed
        (PostgreSQL: the channel was lost, and again each second until it is back)."""
        self._heard = heard

    async def _publish(self, current: _Tx) -> None:
        if self.dialect == "sqlite":  # one process: its own commit is all there is to hear
            current.after_commit.append(lambda: self._heard(current.changed))
            return
        chunk: list[str] = []
        for key in sorted(current.changed):  # pg_notify takes 8000 bytes at most
            if sum(map(len, chunk)) + len(chunk) + len(key) > 7000:
                await self.run("SELECT pg_notify(:channel, :keys)", channel=CHANNEL, keys="\n".join(chunk))
                chunk = []
            chunk.append(key)
        await self.run("SELECT pg_notify(:channel, :keys)", channel=CHANNEL, keys="\n".join(chunk))

    @staticmethod
    def in_transaction() -> bool:
        """Whether this task is inside a transaction now."""
        return _CURRENT_TX.get() is not None

    def changed(self, *keys: str) -> None:
        """``keys`` change when the current transaction commits: every coordinator process
        on this database hears of it (``subscribe``), nobody if it rolls back."""
        current = _CURRENT_TX.get()
        if current is None:
            raise RuntimeError("Store.changed() outside a transaction")
        current.changed.update(keys)

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the current transaction commits (now, outside one)."""
        current = _CURRENT_TX.get()
        if current is None:
            callback()
        else:
            current.after_commit.append(callback)

    # ---- statements -------------------------------------------------------------------

    async def rows(self, sql: str, _decode_json: bool = True, **values: Any) -> list[Any]:
        """The rows of a query, as dicts; each query's method says which row type they are
        (``rows.py``), so that is written once, at its signature."""
        self.statements += 1
        rows = await self.driver.fetch(sql, _encode(values), _CURRENT_TX.get() is not None)
        return [_row(r, _decode_json) for r in rows]

    async def read(self, sql: str, **values: Any) -> list[dict]:
        """A query of the caller's own: invariant checks in tests, one-off tools."""
        return await self.rows(sql, **values)

    async def row(self, sql: str, **values: Any) -> Any:
        """The first row of a query, or None."""
        rows = await self.rows(sql, **values)
        return rows[0] if rows else None

    async def run(self, sql: str, **values: Any) -> None:
        """A statement whose rows nobody reads; a UNIQUE constraint it hits raises ``UniqueViolation``."""
        if _CURRENT_TX.get() is None:  # a write is always a transaction (on SQLite: the writer's)
            async with self.tx():
                return await self.run(sql, **values)
        self.statements += 1
        try:
            await self.driver.execute(sql, _encode(values))
        except Exception as exc:
            if _is_unique_violation(exc):
                raise UniqueViolation(str(exc)) from exc
            raise

    async def insert(self, table: str, row: Mapping[str, Any]) -> None:
        """Insert one row (its keys are the columns)."""
        await self.insert_many(table, [row])

    async def insert_many(self, table: str, rows: Sequence[Mapping[str, Any]], upsert_key: str | None = None,
                          kept: tuple[str, ...] = ()) -> None:
        """Insert ``rows`` as one batch; with ``upsert_key``, rows already there are updated
        (but for their ``kept`` columns, which other writers own)."""
        if not rows:
            return
        if _CURRENT_TX.get() is None:
            async with self.tx():
                return await self.insert_many(table, rows, upsert_key, kept)
        columns = list(rows[0])
        conflict = ""
        if upsert_key:
            sets = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in (*upsert_key.split(", "), *kept))
            conflict = f" ON CONFLICT ({upsert_key}) DO UPDATE SET {sets}"
        self.statements += 1
        try:
            await self.driver.insert_many(table, columns, conflict, [_encode(row) for row in rows])
        except Exception as exc:
            if _is_unique_violation(exc):
                raise UniqueViolation(str(exc)) from exc
            raise

    async def update(self, table: str, key: str, key_value: Any, fields: dict[str, Any]) -> None:
        """Set ``fields`` of the row of ``table`` whose ``key`` is ``key_value``."""
        sets = ", ".join(f"{c} = :{c}" for c in fields)
        await self.run(f"UPDATE {table} SET {sets} WHERE {key} = :_key", _key=key_value, **fields)

