"""All SQL of the coordinator, in one place. Rules live in the rule modules, not here.

The same SQL runs on two drivers: SQLite through two long-lived aiosqlite connections
(one writes, under a lock, since SQLite has one writer; one reads what is committed), and
PostgreSQL through ``databases`` + asyncpg. ``databases`` opens a new SQLite connection,
with a thread of its own, for every query outside a transaction (1.2 ms a SELECT on the
benchmark machine, against 0.06 ms on a kept connection), hence the SQLite driver.

Every statement is counted (``Store.statements``; a batch of rows counts once): the tests
hold the heartbeat to a fixed number of statements whatever the number of devices.
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
import logging
import os
import re
import sqlite3
from typing import Any, Callable, Literal, Mapping, Sequence, overload

from device_loop.core import FLASH_KIND, LIVE_LEASE_STATES, LIVE_OP_STATES

from device_loop.core.vocabulary import (OPEN_JOB_STATES, OPEN_TICKET_STATES, VOCABULARY, JobState, OperationState,
                                         TicketKind, TicketState, sql_list)

from .migrations import MIGRATIONS, SERIAL
from .rows import (AdoptionRow, AuditRow, CandidateRow, DeviceFacts, FlashedImage, HostRow, IdempotencyRow, ImageRow,
                   JobCellRow, JobLeaseRow, JobRow, JobRunRow, KnownGoodImage, LeaseRow, LeaseView, ListedImage,
                   OperationRow, OperationView, RingRow, TicketRow, TokenRow)

log = logging.getLogger(__name__)

# A state is its text to the database. sqlite3 binds a plain str at once but looks a str
# subclass up as a type to adapt first; registered, it costs what a str does (a changed
# 1000-device heartbeat writes two of them a device: bench/fast_path.py, 1.5x its time).
for _enum in (*VOCABULARY, JobState):
    sqlite3.register_adapter(_enum, str.__str__)

CHANNEL = "device_loop"  # PostgreSQL notifications: the keys a commit changed, one a line
LIVE = LIVE_LEASE_STATES
RING_SLOTS = 20  # state changes each device keeps (docs/architecture.md, "Lifecycle")
_LIVE_SQL = sql_list(LIVE)
_LIVE_OP_SQL = sql_list(LIVE_OP_STATES)
_OPEN_TICKETS_SQL = sql_list(OPEN_TICKET_STATES)
_OPEN_JOBS_SQL = sql_list(OPEN_JOB_STATES)
_JSON_COLUMNS = {"tags", "plugins", "services", "superseded_boots", "busy_by", "detail", "resources", "host_services",
                 "seconds", "args", "result", "steps", "facts", "spec", "fingerprint", "readings", "samples"}
DEVICE_COLUMNS = ("name", "class", "tags", "host", "state", "present", "health", "health_reason", "conflict_host",
                  "reclaim_lease", "busy_by", "retired", "created_at", "updated_at", "resources", "report_digest",
                  "log_seq", "state_since", "steps", "facts", "fidelity")
_BOOL_COLUMNS = {"online", "present", "retired", "admin", "draining", "host_online", "host_draining", "link_lost",
                 "host_link_lost", "exclusive", "destructive", "warmup", "interrupted"}
_NO_LIMIT = 2**62  # a count's limit where there is none (BIGINT)
_COUNTED = ("live_leases", "image_bytes", "open_tickets", "open_jobs")  # user_counts: what each person holds
_MAX_PARAMS = 30_000  # per statement: SQLite allows 32766, asyncpg 32767

# A device with the facts its state follows from (rows.DeviceFacts): its live lease and its
# host, and the exclusive operation running on it (each at most one, by partial UNIQUE indexes).
_LIVE_EXCLUSIVE = f"o.exclusive AND o.state IN {_LIVE_OP_SQL}"
_DEVICE_FACTS = (
    "SELECT d.*, l.id AS lease_id, l.state AS lease_state, l.holder AS holder, l.expires_at AS expires_at, "
    "h.online AS host_online, h.draining AS host_draining, o.id AS op_id, o.kind AS op_kind, "
    "o.progress_detail AS op_detail FROM devices d "
    f"LEFT JOIN leases l ON l.device = d.name AND l.state IN {_LIVE_SQL} "
    "LEFT JOIN hosts h ON h.name = d.host "
    f"LEFT JOIN operations o ON o.device = d.name AND {_LIVE_EXCLUSIVE}")


class UniqueViolation(Exception):
    """A write hit a UNIQUE constraint (on SQLite or PostgreSQL)."""


def _is_unique_violation(exc: Exception) -> bool:
    """sqlite3 / aiosqlite and asyncpg each name it their own way."""
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


class _SQLite:
    """SQLite on the event loop's own thread: a statement on a local file takes
    microseconds, less than handing it to a worker thread and back (the benchmark in
    bench/fast_path.py measured both). Two connections: one writes, under a lock, since
    SQLite has one writer; one reads what is committed (WAL).

    The loop never waits for another process's lock, though (``device-loop admin
    --data-dir`` on a live lab holds the write lock a while): SQLite itself waits
    ``BUSY_WAIT_MS`` at most, and a step that still finds the database locked (taking the
    write lock, a read, a commit) is tried again after an ``asyncio.sleep``, 1 ms doubling
    to 50 ms, for ``BUSY_DEADLINE_S`` at most; requests, long-polls and the reaper run
    meanwhile. Statements inside a transaction hold the write lock already: never busy."""

    BUSY_WAIT_MS = 2  # what a statement may block the loop for on a lock
    BUSY_DEADLINE_S = 30.0  # then the database is taken for stuck: the step raises

    def __init__(self, path: str):
        self.path = path
        self.writer: sqlite3.Connection  # both made by connect()
        self.reader: sqlite3.Connection
        self.lock = asyncio.Lock()

    async def connect(self) -> None:
        if self.path != ":memory:":  # readable by this account only (SQLite gives its -wal, -shm the same mode)
            os.close(os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600))
            os.chmod(self.path, 0o600)
        self.writer, self.reader = (sqlite3.connect(self.path, isolation_level=None) for _ in range(2))
        for conn in (self.writer, self.reader):
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {self.BUSY_WAIT_MS}")
        await self._unlocked(lambda: self.writer.execute("PRAGMA journal_mode = WAL"))
        # WAL + NORMAL: a commit survives a crash of this process (kill -9), not a power cut.
        self.writer.execute("PRAGMA synchronous = NORMAL")

    async def disconnect(self) -> None:
        for conn in (self.writer, self.reader):
            conn.close()

    @staticmethod
    def _busy(exc: sqlite3.OperationalError) -> bool:
        return exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY  # (extended codes: BUSY_SNAPSHOT...)

    async def _unlocked(self, step: Callable[[], Any]) -> Any:
        """``step()``, tried again off the loop while another process holds the lock it needs."""
        try:
            return step()
        except sqlite3.OperationalError as exc:
            if not self._busy(exc):
                raise
        return await self._retried(step)

    async def _retried(self, step: Callable[[], Any]) -> Any:
        loop = asyncio.get_running_loop()
        deadline, pause = loop.time() + self.BUSY_DEADLINE_S, 0.001
        while True:
            await asyncio.sleep(pause)
            try:
                return step()
            except sqlite3.OperationalError as exc:
                if not self._busy(exc) or loop.time() > deadline:
                    raise
            pause = min(pause * 2, 0.05)

    async def fetch(self, sql: str, values: dict, in_tx: bool) -> list[dict]:
        if in_tx:
            return [dict(r) for r in self.writer.execute(sql, values)]
        try:  # (_unlocked spelt out: a coroutine less on the path of every read)
            return [dict(r) for r in self.reader.execute(sql, values)]
        except sqlite3.OperationalError as exc:
            if not self._busy(exc):
                raise
        return await self._retried(lambda: [dict(r) for r in self.reader.execute(sql, values)])

    async def execute(self, sql: str, values: dict) -> None:
        self.writer.execute(sql, values)

    async def insert_many(self, table: str, columns: list[str], conflict: str, rows: list[dict]) -> None:
        # one statement prepared once, run per row: sqlite3 binds a name in time linear in
        # the number of names, so one multi-row INSERT of 1000 rows took 0.9 s here
        marks = ", ".join(f":{c}" for c in columns)
        self.writer.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks}){conflict}", rows)

    @contextlib.asynccontextmanager
    async def transaction(self):
        async with self.lock:
            await self._unlocked(lambda: self.writer.execute("BEGIN IMMEDIATE"))
            try:
                yield
                await self._unlocked(lambda: self.writer.execute("COMMIT"))
            except BaseException:
                if self.writer.in_transaction:  # (a commit that failed leaves it open)
                    self.writer.execute("ROLLBACK")
                raise


class _Databases:
    """PostgreSQL: ``databases`` keeps the asyncpg pool and the transactions; statements go to
    asyncpg itself. Through ``databases`` each one was compiled by SQLAlchemy again (122 µs
    of CPU a statement against 20 µs), and every connection handed back to the pool was
    reset with four statements of its own: bench/capacity.py measured both."""

    def __init__(self, url: str):
        import asyncpg
        import databases

        class Connection(asyncpg.Connection):
            def get_reset_query(self) -> str:
                return ""  # the coordinator keeps no session state (its LISTEN has a connection of its own)

        self.db = databases.Database(url, connection_class=Connection)

    async def connect(self) -> None:
        await self.db.connect()

    async def disconnect(self) -> None:
        await self.db.disconnect()

    async def fetch(self, sql: str, values: dict, in_tx: bool) -> list[dict]:
        text, names = _positional(sql)
        async with self.db.connection() as connection:  # the transaction's, inside one
            return [dict(r) for r in await connection.raw_connection.fetch(text, *(values[n] for n in names))]

    async def execute(self, sql: str, values: dict) -> None:
        text, names = _positional(sql)
        async with self.db.connection() as connection:
            await connection.raw_connection.execute(text, *(values[n] for n in names))

    async def insert_many(self, table: str, columns: list[str], conflict: str, rows: list[dict]) -> None:
        """One multi-row INSERT per chunk: one round trip to the server for many rows."""
        per_chunk = max(1, _MAX_PARAMS // len(columns))
        for start in range(0, len(rows), per_chunk):
            values: dict[str, Any] = {}
            marks: list[str] = []
            for i, row in enumerate(rows[start:start + per_chunk]):
                marks.append("(" + ", ".join(f":{c}_{i}" for c in columns) + ")")
                values |= {f"{c}_{i}": row[c] for c in columns}
            await self.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES {', '.join(marks)}{conflict}",
                               values)

    def transaction(self):
        return self.db.transaction()


@functools.lru_cache(maxsize=1024)
def _positional(sql: str) -> tuple[str, tuple[str, ...]]:
    """``:name`` parameters as asyncpg's ``$1``, and the names in that order."""
    names: list[str] = []

    def number(match: re.Match) -> str:
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    return re.sub(r"(?<![:\w]):([A-Za-z_]\w*)", number, sql), tuple(names)


class _Listener:
    """PostgreSQL's LISTEN on a connection of its own, for ``Store.subscribe``."""

    RETRY_S = 1.0
    CHECK_S = 10.0  # a connection cut without a word (a partition, a failover) is found by asking

    def __init__(self, url: str, heard: Callable[[set[str] | None], None]):
        self.dsn = url.replace("postgresql+asyncpg://", "postgresql://", 1)
        self.heard = heard
        self.connection: Any = None  # an asyncpg connection, once start() made one
        self.retrying: asyncio.Task | None = None
        self.checking: asyncio.Task | None = None
        self.closing = False

    async def open(self) -> None:
        await self.start()
        self.checking = asyncio.get_running_loop().create_task(self._check())

    async def _check(self) -> None:
        while not self.closing:
            await asyncio.sleep(self.CHECK_S)
            connection = self.connection
            if connection is None or connection.is_closed():
                continue  # ``_retry`` is on it
            try:
                await asyncio.wait_for(connection.fetchval("SELECT 1"), self.CHECK_S / 2)
            except Exception as exc:  # asyncpg's errors, OSError, a timeout: all mean the same here
                log.warning("the PostgreSQL notification channel does not answer (%r); reconnecting", exc)
                connection.terminate()  # its termination listener starts ``_retry``

    async def start(self) -> None:
        import asyncpg

        self.connection = await asyncpg.connect(self.dsn)
        await self.connection.add_listener(CHANNEL, lambda _c, _pid, _ch, payload: self.heard(set(payload.split("\n"))))
        self.connection.add_termination_listener(self._lost)

    def _lost(self, _connection) -> None:
        if not self.closing:
            log.warning("lost the PostgreSQL notification channel; long-polls re-read every %gs until it is back",
                        self.RETRY_S)
            self.retrying = asyncio.get_running_loop().create_task(self._retry())

    async def _retry(self) -> None:
        while not self.closing:
            self.heard(None)  # what changed meanwhile was not heard
            await asyncio.sleep(self.RETRY_S)
            try:
                await self.start()
            except Exception as exc:  # the server is away: asyncpg raises OSError or its own errors
                log.warning("PostgreSQL notification channel: %s; retrying", exc)
                continue
            log.info("PostgreSQL notification channel back")
            self.heard(None)
            return

    async def close(self) -> None:
        self.closing = True
        for task in (self.retrying, self.checking):
            if task:
                task.cancel()
        if self.connection and not self.connection.is_closed():
            await self.connection.close()


class _Tx:
    def __init__(self):
        self.after_commit: list[Callable[[], None]] = []
        self.changed: set[str] = set()


_CURRENT_TX: contextvars.ContextVar[_Tx | None] = contextvars.ContextVar("device_loop_tx", default=None)


class Store:
    def __init__(self, url: str):
        self.url = url
        self.dialect = "postgresql" if url.startswith(("postgres", "postgresql")) else "sqlite"
        self.driver = _Databases(url) if self.dialect == "postgresql" else _SQLite(url.split("sqlite:///", 1)[1])
        # lock the host's row for the whole heartbeat (SQLite has one writer anyway)
        self._for_update = " FOR UPDATE" if self.dialect == "postgresql" else ""
        self.statements = 0
        self._heard: Callable[[set[str] | None], None] = lambda keys: None
        self._listener: _Listener | None = None

    def _in(self, column: str, param: str, values: list) -> tuple[str, dict[str, Any]]:
        """``column`` is one of ``values``, as one parameter (SQLite binds each named
        parameter in time linear in their number: 1000 of them took milliseconds)."""
        if self.dialect == "postgresql":
            return f"{column} = ANY(:{param})", {param: list(values)}
        return f"{column} IN (SELECT value FROM json_each(:{param}))", {param: json.dumps(list(values))}

    def _values(self, column: str, param: str) -> str:
        """The values of the list parameter ``param`` as rows of one ``column``."""
        if self.dialect == "postgresql":
            return f"SELECT unnest(CAST(:{param} AS TEXT[])) AS {column}"
        return f"SELECT value AS {column} FROM json_each(:{param})"

    def _list_param(self, values: list) -> Any:
        return list(values) if self.dialect == "postgresql" else json.dumps(list(values))

    async def connect(self) -> None:
        await self.driver.connect()
        await self._migrate()
        if self.dialect == "postgresql":
            self._listener = _Listener(self.url, lambda keys: self._heard(keys))
            await self._listener.open()

    async def disconnect(self) -> None:
        if self._listener:
            await self._listener.close()
        await self.driver.disconnect()

    async def _migrate(self) -> None:
        await self._exec("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY)")
        done = {r["version"] for r in await self._all("SELECT version FROM schema_migrations")}
        for version, statements in enumerate(MIGRATIONS, start=1):
            if version in done:
                continue
            async with self.tx():
                for step in statements:
                    sql = step.get(self.dialect) if isinstance(step, dict) else step
                    if sql is not None:
                        await self._exec(sql.format(serial=SERIAL[self.dialect], ring=RING_SLOTS))
                await self._exec("INSERT INTO schema_migrations (version) VALUES (:v)", v=version)

    # ---- transactions -------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def tx(self):
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
                await self._exec("SELECT pg_notify(:channel, :keys)", channel=CHANNEL, keys="\n".join(chunk))
                chunk = []
            chunk.append(key)
        await self._exec("SELECT pg_notify(:channel, :keys)", channel=CHANNEL, keys="\n".join(chunk))

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

    async def _all(self, sql: str, _decode_json: bool = True, **values) -> list[Any]:
        """The rows of a query, as dicts; each query's method says which row type they are
        (``rows.py``), so that is written once, at its signature."""
        self.statements += 1
        rows = await self.driver.fetch(sql, _encode(values), _CURRENT_TX.get() is not None)
        return [_row(r, _decode_json) for r in rows]

    async def read(self, sql: str, **values) -> list[dict]:
        """A query of the caller's own: invariant checks in tests, one-off tools."""
        return await self._all(sql, **values)

    async def _one(self, sql: str, **values) -> Any:
        rows = await self._all(sql, **values)
        return rows[0] if rows else None

    async def _exec(self, sql: str, **values) -> None:
        if _CURRENT_TX.get() is None:  # a write is always a transaction (on SQLite: the writer's)
            async with self.tx():
                return await self._exec(sql, **values)
        self.statements += 1
        try:
            await self.driver.execute(sql, _encode(values))
        except Exception as exc:
            if _is_unique_violation(exc):
                raise UniqueViolation(str(exc)) from exc
            raise

    async def _insert(self, table: str, row: Mapping[str, Any]) -> None:
        await self._insert_many(table, [row])

    async def _insert_many(self, table: str, rows: Sequence[Mapping[str, Any]], upsert_key: str | None = None,
                           kept: tuple[str, ...] = ()) -> None:
        """Insert ``rows`` as one batch; with ``upsert_key``, rows already there are updated
        (but for their ``kept`` columns, which other writers own)."""
        if not rows:
            return
        if _CURRENT_TX.get() is None:
            async with self.tx():
                return await self._insert_many(table, rows, upsert_key, kept)
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

    async def _update(self, table: str, key: str, key_value: Any, fields: dict[str, Any]) -> None:
        sets = ", ".join(f"{c} = :{c}" for c in fields)
        await self._exec(f"UPDATE {table} SET {sets} WHERE {key} = :_key", _key=key_value, **fields)

    # ---- hosts --------------------------------------------------------------------------

    async def host(self, name: str, for_update: bool = False) -> HostRow | None:
        return await self._one("SELECT * FROM hosts WHERE name = :name" + (self._for_update if for_update else ""),
                               name=name)

    async def lock_hosts(self, names: list[str]) -> None:
        """Take the row locks of hosts ``names`` (in the order of their names), as every
        heartbeat does for its own host first (docs/architecture.md, "Leases": one lock order).
        A write that begins or ends a lease takes its device's host's first, so it never
        interleaves with that host's heartbeat, which writes the devices' rows back whole.
        SQLite has one writer: nothing to take there."""
        if self.dialect == "postgresql" and names:
            await self._all("SELECT name FROM hosts WHERE name = ANY(:names) ORDER BY name FOR UPDATE",
                            names=sorted(set(names)))

    async def lock_host_of_device(self, device: str) -> None:
        """``lock_hosts`` for the host of ``device``."""
        if self.dialect == "postgresql":
            await self._all("SELECT h.name FROM hosts h JOIN devices d ON d.host = h.name WHERE d.name = :d "
                            "FOR UPDATE OF h", d=device)

    async def hosts(self) -> list[HostRow]:
        return await self._all("SELECT * FROM hosts ORDER BY name")

    async def save_host(self, row: dict, new: bool) -> None:
        if new:
            await self._insert("hosts", row)
        else:
            await self._update("hosts", "name", row["name"], {k: v for k, v in row.items() if k != "name"})

    async def hosts_silent_since(self, now: float, periods: float, minimum: float, serving_since: float) -> list[str]:
        """Online hosts not heard of for ``periods`` of their heartbeat (``minimum`` seconds at
        least), counting from ``serving_since`` at the earliest."""
        rows = await self._all(
            "SELECT name FROM hosts WHERE online AND "
            "CASE WHEN last_seen > :since THEN last_seen ELSE :since END < :now - "
            "CASE WHEN heartbeat_s * :periods > :minimum THEN heartbeat_s * :periods ELSE :minimum END ORDER BY name",
            now=now, periods=periods, minimum=minimum, since=serving_since)
        return [r["name"] for r in rows]

    async def host_heartbeats(self) -> list[dict]:
        """Each host's name, whether it is online, and when it last reported."""
        return await self._all("SELECT name, online, last_seen FROM hosts ORDER BY name")

    async def set_host_draining(self, name: str, draining: bool) -> None:
        await self._exec("UPDATE hosts SET draining = :d WHERE name = :name", d=draining, name=name)

    async def set_link_lost(self, name: str, boot_id: str) -> None:
        """``boot_id`` of ``name`` dropped its long-poll (no later boot has reported yet)."""
        await self._exec("UPDATE hosts SET link_lost = :lost WHERE name = :name AND boot_id = :boot",
                         lost=True, name=name, boot=boot_id)

    async def set_host_offline(self, name: str) -> None:
        await self._exec("UPDATE hosts SET online = :off WHERE name = :name", off=False, name=name)

    # ---- devices ------------------------------------------------------------------------

    async def device(self, name: str) -> DeviceFacts | None:
        """A device with its facts."""
        return await self._one(f"{_DEVICE_FACTS} WHERE d.name = :name", name=name)

    async def devices(self) -> list[DeviceFacts]:
        """Every device with its facts (the holder and expiry of a live lease are public)."""
        return await self._all(f"{_DEVICE_FACTS} ORDER BY d.name")

    async def device_counts(self) -> list[dict]:
        """How many devices there are of each state and class."""
        return await self._all("SELECT state, class, COUNT(*) AS n FROM devices GROUP BY state, class")

    async def device_names(self, limit: int) -> list[str]:
        return [r["name"] for r in await self._all("SELECT name FROM devices ORDER BY name LIMIT :n", n=limit)]

    async def idle_device_of_class(self, device_class: str, other_than: str) -> str | None:
        row = await self._one("SELECT name FROM devices WHERE class = :c AND name <> :n AND state = 'idle' "
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
        return await self._all(f"{_DEVICE_FACTS} WHERE {where}", _decode_json=decode_json, host=host)

    async def report_digests(self, host: str) -> dict[str, str]:
        """Device name -> digest of its last report, for the devices ``host`` owns."""
        rows = await self._all("SELECT name, report_digest FROM devices WHERE host = :host", host=host)
        return {r["name"]: r["report_digest"] for r in rows}

    async def devices_named(self, names: list[str]) -> list[DeviceFacts]:
        if not names:
            return []
        where, params = self._in("d.name", "names", names)
        return await self._all(f"{_DEVICE_FACTS} WHERE {where}", **params)

    async def device_hosts(self) -> list[dict]:
        return await self._all("SELECT name, host, conflict_host FROM devices ORDER BY name")

    async def write_devices(self, rows: list[dict]) -> None:
        """Insert or update whole device rows (keys other than ``DEVICE_COLUMNS`` are facts, not
        columns); a claim by another host is that host's to write (``set_claims``)."""
        await self._insert_many("devices", [{c: row[c] for c in DEVICE_COLUMNS} for row in rows], upsert_key="name",
                                kept=("conflict_host",))

    async def set_claims(self, host: str, names: list[str]) -> None:
        """``host`` reports ``names`` too, which other hosts own."""
        where, params = self._in("name", "names", names)
        await self._exec(f"UPDATE devices SET conflict_host = :host WHERE {where}", host=host, **params)

    async def drop_claims(self, host: str, names: list[str] | None = None) -> None:
        """``host`` no longer reports ``names`` (default: any device) that other hosts own."""
        where, params = self._in("name", "names", names) if names is not None else ("TRUE", {})
        await self._exec(f"UPDATE devices SET conflict_host = NULL WHERE conflict_host = :host AND {where}",
                         host=host, **params)

    async def update_device(self, name: str, **fields) -> None:
        await self._update("devices", "name", name, fields)

    async def update_device_logged(self, name: str, **fields) -> int:
        """Update a device whose state changed; returns the sequence number of that change."""
        sets = ", ".join(f"{c} = :{c}" for c in fields)
        row = await self._one(f"UPDATE devices SET {sets}, log_seq = log_seq + 1 WHERE name = :_key RETURNING log_seq",
                              _key=name, **fields)
        return row["log_seq"]

    async def add_ring_entries(self, entries: list[dict]) -> None:
        """State changes (with their ``seq``) into each device's ring of ``RING_SLOTS``."""
        await self._insert_many("device_ring", [{**e, "slot": e["seq"] % RING_SLOTS} for e in entries],
                                upsert_key="device, slot")

    async def device_log(self, device: str) -> list[RingRow]:
        return await self._all("SELECT * FROM device_ring WHERE device = :d ORDER BY seq", d=device)

    # ---- resources: which device owns an identifier ---------------------------------

    async def identifier_owners(self, identifiers: list[str]) -> list[dict]:
        if not identifiers:
            return []
        where, params = self._in("r.identifier", "identifiers", identifiers)
        return await self._all(
            "SELECT r.identifier, r.device, d.host, d.present, h.online AS host_online FROM resources r "
            f"JOIN devices d ON d.name = r.device LEFT JOIN hosts h ON h.name = d.host WHERE {where}", **params)

    async def replace_identities(self, devices: list[str], rows: list[dict]) -> None:
        """Give each of ``devices`` exactly its ``rows``, taking identifiers from other devices."""
        by_device, params = self._in("device", "devices", devices)
        by_identifier, more = self._in("identifier", "identifiers", [r["identifier"] for r in rows])
        await self._exec(f"DELETE FROM resources WHERE {by_device} OR {by_identifier}", **params, **more)
        await self._insert_many("resources", rows)

    # ---- leases -------------------------------------------------------------------------

    async def insert_lease(self, row: LeaseRow) -> None:
        await self._insert("leases", row)

    async def lease(self, lease_id: str) -> LeaseRow | None:
        return await self._one("SELECT * FROM leases WHERE id = :id", id=lease_id)

    _LEASE_VIEW = ("SELECT l.*, d.state AS device_state, d.host AS device_host, d.resources, d.needs_recovery, "
                   "d.fault AS device_fault, d.fault_kind AS device_fault_kind, "
                   "h.online AS host_online, h.link_lost AS host_link_lost, h.services AS host_services, "
                   "o.id AS op_id, o.kind AS op_kind FROM leases l "
                   "JOIN devices d ON d.name = l.device LEFT JOIN hosts h ON h.name = d.host "
                   f"LEFT JOIN operations o ON o.device = l.device AND {_LIVE_EXCLUSIVE}")

    async def lease_holders(self, lease_ids: list[str]) -> dict[str, str]:
        """Lease id -> its holder, for ``lease_ids`` (those that exist)."""
        where, params = self._in("id", "ids", lease_ids)
        return {r["id"]: r["holder"] for r in await self._all(f"SELECT id, holder FROM leases WHERE {where}", **params)}

    async def lease_view(self, lease_id: str) -> LeaseView | None:
        """A lease with what its answer shows: its device's state and resources, its host's services."""
        return await self._one(f"{self._LEASE_VIEW} WHERE l.id = :id", id=lease_id)

    async def live_lease_views_of_holder(self, holder: str) -> list[LeaseView]:
        return await self._all(f"{self._LEASE_VIEW} WHERE l.holder = :h AND l.state IN {_LIVE_SQL} "
                               "ORDER BY l.created_at", h=holder)

    async def last_lease_view(self, holder: str, device: str) -> LeaseView | None:
        """``holder``'s latest lease on ``device``, live or ended."""
        return await self._one(f"{self._LEASE_VIEW} WHERE l.holder = :h AND l.device = :d "
                               "ORDER BY l.created_at DESC LIMIT 1", h=holder, d=device)

    async def live_lease_counts(self) -> dict[str, int]:
        """Live leases in the whole lab, by state."""
        rows = await self._all(f"SELECT state, COUNT(*) AS n FROM leases WHERE state IN {_LIVE_SQL} GROUP BY state")
        return {r["state"]: r["n"] for r in rows}

    async def live_leases_of_holder(self, holder: str) -> list[LeaseRow]:
        return await self._all(f"SELECT * FROM leases WHERE holder = :h AND state IN {_LIVE_SQL} ORDER BY created_at",
                               h=holder)

    async def desired_services(self, host: str) -> list[dict]:
        """The live leases of the devices ``host`` serves, with those devices' resources."""
        return await self._all(
            "SELECT l.id, l.holder, l.device, l.secret, d.resources FROM leases l JOIN devices d ON d.name = l.device "
            f"WHERE d.host = :host AND d.present AND NOT d.retired AND l.state IN {_LIVE_SQL} ORDER BY l.id", host=host)

    async def leases_past(self, column: str, states: tuple[str, ...], before: float) -> list[LeaseRow]:
        """Leases in ``states`` whose ``column`` is before ``before``, by their devices' hosts
        (ending them takes those hosts' locks in that order: two reapers never cross)."""
        marks = ", ".join(f"'{s}'" for s in states)
        return await self._all(f"SELECT l.* FROM leases l LEFT JOIN devices d ON d.name = l.device WHERE l.state IN "
                               f"({marks}) AND l.{column} < :before ORDER BY d.host, l.id", before=before)

    async def end_lease(self, lease_id: str, state: str, reason: str, now: float, overdue: bool = False,
                        pending: bool = False) -> bool:
        """Move a live lease to a final state; False if it was no longer live (here or in
        another coordinator process), or no longer ``overdue`` (renewed meanwhile) or
        ``pending`` (its services came up meanwhile) when asked to be. The conditions are
        in the statement: a commit of another process in between is what it sees."""
        where = f"id = :id AND state IN {_LIVE_SQL}"
        where += " AND expires_at <= :now" if overdue else ""
        where += " AND state = 'pending'" if pending else ""
        ended = await self._one(  # its secret dies with it: nothing keeps it longer
            f"UPDATE leases SET state = :state, end_reason = :reason, ended_at = :now, secret = NULL WHERE {where} "
            "RETURNING holder", state=state, reason=reason, now=now, id=lease_id)
        if ended is None:
            return False
        await self._exec("UPDATE user_counts SET live_leases = live_leases - 1 WHERE name = :n", n=ended["holder"])
        return True

    # ---- what each person holds, counted where it changes --------------------------------

    async def insert_lease_if_free(self, row: LeaseRow) -> bool:
        """Insert a lease unless its device has a live one (the partial UNIQUE index says so):
        False then, and nothing written, so the transaction goes on (a grant tries another)."""
        columns = list(row)
        inserted = await self._one(f"INSERT INTO leases ({', '.join(columns)}) VALUES "
                                   f"({', '.join(':' + c for c in columns)}) ON CONFLICT DO NOTHING RETURNING id",
                                   **row)
        return inserted is not None

    async def count_lease(self, holder: str, limit: int | None) -> bool:
        """Count a new live lease of ``holder``: False, and nothing counted, if they hold
        ``limit`` already. One statement, so two coordinator processes cannot both see room
        for one more: the second waits for the first's row and sees its count."""
        return await self._count_up("live_leases", holder, 1, limit)

    async def count_image_bytes(self, uploader: str, size: int, quota: int | None) -> bool:
        """Count ``size`` more bytes of images uploaded by ``uploader``: False, and nothing
        counted, if that would take them over ``quota``."""
        return await self._count_up("image_bytes", uploader, size, quota)

    async def _count_up(self, column: str, name: str, amount: int, limit: int | None) -> bool:
        if limit is not None and amount > limit:
            return False  # (the INSERT below counts a first amount without asking)
        others = [c for c in _COUNTED if c != column]
        zeros = ", ".join("0" for _ in others)
        row = await self._one(
            f"INSERT INTO user_counts (name, {column}, {', '.join(others)}) VALUES (:n, :a, {zeros}) "
            f"ON CONFLICT (name) DO UPDATE SET {column} = user_counts.{column} + :a "
            f"WHERE user_counts.{column} + :a <= :limit RETURNING name",
            n=name, a=amount, limit=_NO_LIMIT if limit is None else limit)
        return row is not None

    async def count_ticket(self, requester: str, limit: int | None) -> bool:
        """Count an open ticket of ``requester``: False, and nothing counted, at ``limit``."""
        return await self._count_up("open_tickets", requester, 1, limit)

    async def uncount_ticket(self, requester: str) -> None:
        await self._exec("UPDATE user_counts SET open_tickets = open_tickets - 1 WHERE name = :n", n=requester)

    async def uncount_image_bytes(self, uploader: str, size: int) -> None:
        await self._exec("UPDATE user_counts SET image_bytes = image_bytes - :a WHERE name = :n", a=size, n=uploader)

    async def user_counts(self, name: str) -> dict:
        """What ``name`` holds: live leases and bytes of uploaded images."""
        row = await self._one("SELECT live_leases, image_bytes FROM user_counts WHERE name = :n", n=name)
        return row or {"live_leases": 0, "image_bytes": 0}

    async def activate_leases(self, lease_ids: list[str]) -> list[dict]:
        """Pending leases become active; those that did, with their ``created_at``."""
        if not lease_ids:
            return []
        where, params = self._in("id", "ids", lease_ids)
        return await self._all(f"UPDATE leases SET state = 'active' WHERE state = 'pending' AND {where} "
                               "RETURNING id, created_at", **params)

    async def set_lease_expiry(self, lease_id: str, expires_at: float) -> bool:
        """False if the lease is no longer live (ended by another process meanwhile)."""
        renewed = await self._one(f"UPDATE leases SET expires_at = :e WHERE id = :id AND state IN {_LIVE_SQL} "
                                  "RETURNING id", e=expires_at, id=lease_id)
        return renewed is not None

    # ---- audit --------------------------------------------------------------------------

    async def add_audit(self, row: dict) -> int:
        """Append to the audit log; the entry's id."""
        if _CURRENT_TX.get() is None:
            async with self.tx():
                return await self.add_audit(row)
        columns = ", ".join(row)
        entry = await self._one(f"INSERT INTO audit ({columns}) VALUES ({', '.join(':' + c for c in row)}) "
                                "RETURNING id", **row)
        return entry["id"]

    async def audit(self, limit: int = 100) -> list[AuditRow]:
        return await self._all("SELECT * FROM audit ORDER BY id DESC LIMIT :n", n=limit)

    # ---- idempotency keys -----------------------------------------------------------------

    async def idempotency_key(self, caller: str, key: str) -> IdempotencyRow | None:
        return await self._one("SELECT * FROM idempotency WHERE caller = :c AND key = :k", c=caller, k=key)

    async def save_idempotency_key(self, row: IdempotencyRow) -> None:
        await self._insert("idempotency", row)

    async def drop_idempotency_keys_before(self, before: float) -> None:
        await self._exec("DELETE FROM idempotency WHERE created_at < :t", t=before)

    # ---- API tokens (only their hashes are stored) ----------------------------------------

    async def insert_token(self, row: TokenRow) -> None:
        async with self.tx():
            await self._insert("tokens", row)

    async def token(self, token_id: str) -> TokenRow | None:
        return await self._one("SELECT * FROM tokens WHERE id = :id", id=token_id)

    async def token_by_hash(self, digest: str) -> TokenRow | None:
        return await self._one("SELECT * FROM tokens WHERE hash = :h", h=digest)

    async def tokens(self) -> list[TokenRow]:
        return await self._all("SELECT * FROM tokens ORDER BY created_at")

    async def revoke_token(self, token_id: str, now: float) -> None:
        await self._exec("UPDATE tokens SET revoked_at = :now WHERE id = :id AND revoked_at IS NULL",
                         now=now, id=token_id)

    # ---- the image registry ---------------------------------------------------------------

    async def insert_image(self, row: ImageRow) -> None:
        await self._insert("images", row)

    async def image(self, sha256: str) -> ImageRow | None:
        """An image by its sha256 (never by its name: images.py says why)."""
        return await self._one("SELECT * FROM images WHERE sha256 = :s", s=sha256)

    async def images_by_prefix(self, prefix: str) -> list[ImageRow]:
        """Images whose sha256 starts with ``prefix`` (lower-case hex): a few, to name them."""
        return await self._all("SELECT * FROM images WHERE sha256 LIKE :p ORDER BY name LIMIT 5", p=prefix + "%")

    async def images_named(self, name: str) -> list[ImageRow]:
        """The images called ``name`` (one per target at most)."""
        return await self._all("SELECT * FROM images WHERE name = :n ORDER BY target", n=name)

    async def pin_image_file(self, sha256: str, at: float) -> None:
        """An upload is about to put the file of ``sha256`` in place: the sweep leaves it alone
        until its row is there (or the pin is old)."""
        await self._insert_many("image_files", [{"sha256": sha256, "pinned_at": at}], upsert_key="sha256")

    async def adopt_image_files(self, sha256s: list[str], at: float) -> None:
        """Files found in the registry's folder without a row of their own (left by an earlier
        version, or a crash): rows for them, pinned ``at``, so the sweep treats them as any other."""
        if sha256s:
            await self._exec("INSERT INTO image_files (sha256, pinned_at) SELECT value, :at FROM "
                             f"({self._values('value', 'shas')}) found ON CONFLICT (sha256) DO NOTHING",
                             at=at, shas=self._list_param(sha256s))

    async def image_file_names(self) -> set[str]:
        return {r["sha256"] for r in await self._all("SELECT sha256 FROM image_files")}

    async def unused_image_files(self, pinned_before: float) -> list[str]:
        """Take the rows of files that no image uses and no upload pinned since
        ``pinned_before``; their files are the caller's to remove before the transaction
        commits (PostgreSQL keeps those rows locked meanwhile, so a new pin waits)."""
        rows = await self._all("DELETE FROM image_files WHERE pinned_at < :b AND sha256 NOT IN "
                               "(SELECT sha256 FROM images) RETURNING sha256", b=pinned_before)
        return [r["sha256"] for r in rows]

    async def images(self, targets: list[str] | None = None) -> list[ListedImage]:
        """Every image (or those for ``targets``), with the targets it is known-good for."""
        rows: list[ImageRow] = await self._all("SELECT * FROM images ORDER BY created_at DESC")
        good: dict[str, list[str]] = {}
        for mark in await self._all("SELECT DISTINCT sha256, target FROM known_good ORDER BY target"):
            good.setdefault(mark["sha256"], []).append(mark["target"])
        return [{**r, "known_good_for": good.get(r["sha256"], [])} for r in rows
                if targets is None or r["target"] in targets]

    async def mark_known_good(self, row: dict) -> None:
        await self._insert("known_good", row)

    async def latest_known_good(self, target: str) -> KnownGoodImage | None:
        return await self._one("SELECT i.*, k.at AS marked_at FROM known_good k JOIN images i ON i.sha256 = k.sha256 "
                               "WHERE k.target = :t ORDER BY k.id DESC LIMIT 1", t=target)

    async def sole_known_good_targets(self, sha256: str) -> list[str]:
        """The targets for which this image is the only known-good one."""
        rows = await self._all(
            "SELECT target FROM known_good WHERE sha256 = :s AND target NOT IN "
            "(SELECT target FROM known_good WHERE sha256 <> :s) GROUP BY target ORDER BY target", s=sha256)
        return [r["target"] for r in rows]

    async def delete_image(self, sha256: str) -> None:
        await self._exec("DELETE FROM known_good WHERE sha256 = :s", s=sha256)
        await self._exec("DELETE FROM images WHERE sha256 = :s", s=sha256)

    async def images_unused_since(self, before: float) -> list[ImageRow]:
        """Images no target has as known-good, and that nothing used since ``before``."""
        return await self._all("SELECT * FROM images WHERE last_used_at < :b AND sha256 NOT IN "
                               "(SELECT sha256 FROM known_good) AND sha256 NOT IN (SELECT image_sha256 FROM "
                               f"operations WHERE image_sha256 IS NOT NULL AND state IN {_LIVE_OP_SQL}) ORDER BY name",
                               b=before)

    async def known_good_targets(self, sha256: str) -> list[str]:
        return [r["target"] for r in await self._all("SELECT DISTINCT target FROM known_good WHERE sha256 = :s "
                                                     "ORDER BY target", s=sha256)]

    async def set_image_used(self, sha256: str, at: float) -> None:
        await self._exec("UPDATE images SET last_used_at = :at WHERE sha256 = :s", at=at, s=sha256)

    # ---- operations on devices --------------------------------------------------------------

    async def insert_operation(self, row: OperationRow) -> None:
        await self._insert("operations", dict(row))

    _OPERATION_VIEW = "SELECT o.*, h.online AS host_online FROM operations o LEFT JOIN hosts h ON h.name = o.host"

    async def operation(self, op_id: str) -> OperationView | None:
        return await self._one(f"{self._OPERATION_VIEW} WHERE o.id = :id", id=op_id)

    async def operations_of_device(self, device: str, limit: int, kind: str | None = None) -> list[OperationView]:
        """A device's latest operations (of ``kind``), newest first."""
        of_kind = "" if kind is None else " AND o.kind = :k"
        by_kind: dict[str, Any] = {"k": kind} if kind else {}
        return await self._all(f"{self._OPERATION_VIEW} WHERE o.device = :d{of_kind} ORDER BY o.created_at DESC "
                               "LIMIT :n", d=device, n=limit, **by_kind)

    async def last_flashed_image(self, device: str) -> FlashedImage | None:
        """The image of the device's latest flash that completed (a fingerprint names it)."""
        return await self._one("SELECT image_name AS name, image_sha256 AS sha256 FROM operations WHERE device = :d "
                               f"AND kind = '{FLASH_KIND}' AND state = '{OperationState.DONE}' "
                               "AND image_sha256 IS NOT NULL ORDER BY created_at DESC LIMIT 1", d=device)

    async def live_image_uses(self, sha256: str, host: str | None = None) -> list[OperationRow]:
        """The live operations that write image ``sha256`` (on ``host``)."""
        on_host = "" if host is None else " AND host = :h"
        by_host: dict[str, Any] = {"h": host} if host else {}
        return await self._all(f"SELECT * FROM operations WHERE image_sha256 = :s AND state IN {_LIVE_OP_SQL}"
                               f"{on_host} ORDER BY created_at", s=sha256, **by_host)

    async def queued_operations(self, host: str) -> list[OperationRow]:
        """The operations ``host`` should begin (those it began are its own to finish)."""
        return await self._all("SELECT * FROM operations WHERE host = :h AND state = :q ORDER BY created_at",
                               h=host, q=OperationState.QUEUED)

    async def operations_to_update(self, host: str, reported: list[str], restarted: bool,
                                   boot_id: str) -> list[OperationRow]:
        """The operations of ``host`` its report speaks of (an exporter speaks only for its
        own host), and after a restart of its exporter those it ran under an earlier boot."""
        where, params = self._in("id", "ids", reported)
        if restarted:
            where += " OR (state = :running AND boot_id <> :boot)"
            params |= {"boot": boot_id, "running": OperationState.RUNNING}
        return await self._all(f"SELECT * FROM operations WHERE host = :h AND ({where})", h=host,
                               **params)

    async def update_operation(self, op_id: str, fields: dict[str, Any]) -> None:
        await self._update("operations", "id", op_id, fields)

    async def device_classes(self) -> list[str]:
        return [r["class"] for r in await self._all("SELECT DISTINCT class FROM devices ORDER BY class")]

    # ---- network candidates and adoptions ---------------------------------------------

    async def save_candidates(self, rows: list[dict]) -> None:
        await self._insert_many("candidates", rows, upsert_key="identifier")

    async def candidates(self) -> list[CandidateRow]:
        return await self._all(
            "SELECT c.*, a.name AS adopted_as FROM candidates c LEFT JOIN adoptions a ON a.identifier = c.identifier "
            "ORDER BY c.host, c.identifier")

    async def candidate(self, identifier: str) -> dict | None:
        return await self._one("SELECT * FROM candidates WHERE identifier = :i", i=identifier)

    async def insert_adoption(self, row: AdoptionRow) -> None:
        await self._insert("adoptions", row)

    async def adoptions_on_host(self, host: str) -> list[AdoptionRow]:
        return await self._all("SELECT * FROM adoptions WHERE host = :h ORDER BY identifier", h=host)

    # ---- forgetting what will not come back (admin forget) ------------------------------

    async def forget_devices(self, names: list[str]) -> None:
        """Delete devices with what is theirs alone: identifiers, ring logs, adoptions (a
        claim is a column of their row). Their leases, flashes and audit entries stay, as history."""
        by_device, params = self._in("device", "names", names)
        by_name, _ = self._in("name", "names", names)
        await self._exec(f"DELETE FROM resources WHERE {by_device}", **params)
        await self._exec(f"DELETE FROM device_ring WHERE {by_device}", **params)
        await self._exec(f"DELETE FROM adoptions WHERE {by_name}", **params)
        await self._exec(f"DELETE FROM devices WHERE {by_name}", **params)

    async def forget_host(self, name: str) -> None:
        """Delete a host with what it found and was told to adopt (its devices are
        ``forget_devices``'s to delete, its claims ``drop_claims``'s)."""
        await self._exec("DELETE FROM candidates WHERE host = :h", h=name)
        await self._exec("DELETE FROM adoptions WHERE host = :h", h=name)
        await self._exec("DELETE FROM hosts WHERE name = :h", h=name)


    # ---- who gets the next lease: devices free to lease, queue tickets -----------------------

    def _tags_within(self, wanted: str, having: str) -> str:
        """SQL: every tag of the JSON list ``wanted`` is in the JSON list ``having``."""
        if self.dialect == "postgresql":
            return f"CAST({wanted} AS jsonb) <@ CAST({having} AS jsonb)"
        return (f"NOT EXISTS (SELECT 1 FROM json_each({wanted}) w WHERE w.value NOT IN "
                f"(SELECT value FROM json_each({having})))")

    # A device a new lease may have: idle (so present, online, unleased, not being reclaimed,
    # healthy), not needing recovery, no exclusive operation running, its host not drained.
    _FREE = ("d.state = 'idle' AND d.needs_recovery IS NULL AND d.fault IS NULL AND o.id IS NULL "
             "AND (h.draining IS NULL OR NOT h.draining)")

    def _of_class_with_tags(self, device_class: str | None, tags: list[str]) -> tuple[str, dict[str, Any]]:
        """SQL (and its values): device ``d`` is of ``device_class`` (any: None) with all of ``tags``."""
        where = "TRUE"
        values: dict[str, Any] = {}
        if device_class is not None:
            where += " AND d.class = :c"
            values["c"] = device_class
        if tags:
            where += " AND " + self._tags_within(":tags", "d.tags")
            values["tags"] = json.dumps(sorted(tags))
        return where, values

    async def free_devices_named(self, names: list[str]) -> list[DeviceFacts]:
        """Those of ``names`` that are free to lease (``_FREE``)."""
        where, params = self._in("d.name", "names", sorted(set(names)))
        return await self._all(f"{_DEVICE_FACTS} WHERE {self._FREE} AND {where} ORDER BY d.name", **params)

    async def free_devices(self, device_class: str | None, tags: list[str], limit: int) -> list[DeviceFacts]:
        """Devices free to lease of ``device_class`` (any, if None) with every one of ``tags``,
        idle the longest first (wear spreads over the class). Not locked: a lease is taken
        under its host's lock (``lock_hosts``), and the partial UNIQUE index decides."""
        where, values = self._of_class_with_tags(device_class, tags)
        return await self._all(f"{_DEVICE_FACTS} WHERE {self._FREE} AND {where} "
                               "ORDER BY COALESCE(d.state_since, 0), d.name LIMIT :n", n=limit, **values)

    async def matching_device_states(self, device_class: str | None, tags: list[str]) -> dict[str, int]:
        """How many devices of ``device_class`` (any) with all of ``tags`` are in each state."""
        where, values = self._of_class_with_tags(device_class, tags)
        rows = await self._all(f"SELECT d.state AS state, COUNT(*) AS n FROM devices d WHERE {where} GROUP BY d.state",
                               **values)
        return {r["state"]: r["n"] for r in rows}

    async def insert_ticket(self, row: TicketRow) -> None:
        await self._insert("tickets", row)

    async def ticket(self, ticket_id: str, for_update: bool = False) -> TicketRow | None:
        return await self._one("SELECT * FROM tickets WHERE id = :id" + (self._for_update if for_update else ""),
                               id=ticket_id)

    async def any_waiting_ticket(self) -> bool:
        return await self._one("SELECT id FROM tickets WHERE state = :w LIMIT 1", w=TicketState.WAITING) is not None

    _FIRST = ("CASE WHEN t.kind = :interactive OR t.created_at <= :aged THEN 0 ELSE 1 END, t.created_at, t.id")

    def _matching(self, name: str, device_class: str, tags: str) -> str:
        """SQL: waiting ticket ``t`` would take the device whose name, class and tags (JSON)
        these SQL expressions are."""
        return (f"t.state = :waiting AND (t.device IS NULL OR t.device = {name}) AND (t.device_class IS NULL OR "
                f"t.device_class = {device_class}) AND {self._tags_within('t.tags', tags)}")

    async def first_ticket_for(self, device: DeviceFacts, aged_before: float) -> TicketRow | None:
        """The waiting ticket that ``device`` goes to: interactive ones and batch ones older than
        ``aged_before`` first, then the others; first come, first served within each. On
        PostgreSQL it is locked, and one another grant holds is skipped."""
        lock = " FOR UPDATE OF t SKIP LOCKED" if self.dialect == "postgresql" else ""
        return await self._one(
            f"SELECT t.* FROM tickets t WHERE {self._matching(':name', ':class', ':tags')} ORDER BY {self._FIRST} "
            f"LIMIT 1{lock}", name=device["name"], tags=json.dumps(device["tags"]), waiting=TicketState.WAITING,
            interactive=TicketKind.INTERACTIVE, aged=aged_before, **{"class": device["class"]})

    async def free_devices_wanted(self, limit: int) -> list[DeviceFacts]:
        """Devices free to lease that a waiting ticket would take (what a grant on becoming
        idle missed: a ticket made in another process at that moment)."""
        return await self._all(
            f"{_DEVICE_FACTS} WHERE {self._FREE} AND EXISTS (SELECT 1 FROM tickets t WHERE "
            f"{self._matching('d.name', 'd.class', 'd.tags')}) ORDER BY d.host, COALESCE(d.state_since, 0), d.name "
            "LIMIT :n",
            n=limit, waiting=TicketState.WAITING)

    async def grant_ticket(self, ticket_id: str, lease_id: str, device: str, now: float) -> bool:
        """A waiting ticket is granted ``lease_id``; False if it no longer waits (cancelled,
        or granted by another process meanwhile)."""
        row = await self._one("UPDATE tickets SET state = :g, granted_at = :now, lease_id = :l, granted_device = :d "
                              "WHERE id = :id AND state = :w RETURNING id", g=TicketState.GRANTED, now=now,
                              l=lease_id, d=device, id=ticket_id, w=TicketState.WAITING)
        return row is not None

    async def end_ticket(self, ticket_id: str, state: TicketState, reason: str, now: float,
                         from_states: tuple[TicketState, ...]) -> TicketRow | None:
        """Move a ticket in one of ``from_states`` to ``state``: the ticket as it is now, or
        None if it was in none of them (here or in another process)."""
        marks = ", ".join(f"'{s}'" for s in from_states)
        return await self._one(f"UPDATE tickets SET state = :s, reason = :r, ended_at = :now WHERE id = :id AND "
                               f"state IN ({marks}) RETURNING *", s=state, r=reason, now=now, id=ticket_id)

    async def claim_ticket(self, ticket_id: str, now: float) -> bool:
        """A granted ticket's requester has seen its lease."""
        row = await self._one("UPDATE tickets SET state = :c, ended_at = :now WHERE id = :id AND state = :g "
                              "RETURNING id", c=TicketState.CLAIMED, now=now, id=ticket_id, g=TicketState.GRANTED)
        return row is not None

    async def tickets_granted_before(self, before: float) -> list[TicketRow]:
        return await self._all("SELECT * FROM tickets WHERE state = :g AND granted_at < :b ORDER BY granted_at",
                               g=TicketState.GRANTED, b=before)

    async def tickets_of(self, requester: str | None, limit: int) -> list[TicketRow]:
        """``requester``'s tickets (everyone's: None), the open ones first, newest first."""
        where = "" if requester is None else "WHERE requester = :r"
        values: dict[str, Any] = {} if requester is None else {"r": requester}
        return await self._all(f"SELECT * FROM tickets {where} ORDER BY CASE WHEN state IN {_OPEN_TICKETS_SQL} "
                               "THEN 0 ELSE 1 END, created_at DESC LIMIT :n", n=limit, **values)

    async def waiting_tickets(self, limit: int) -> list[TicketRow]:
        """The waiting tickets in the order they are served (``aged`` aside: the caller sorts)."""
        return await self._all("SELECT * FROM tickets WHERE state = :w ORDER BY created_at, id LIMIT :n",
                               w=TicketState.WAITING, n=limit)

    async def tickets_ahead(self, ticket: TicketRow, aged_before: float) -> int:
        """How many waiting tickets for the same thing are served before ``ticket``."""
        first = 0 if ticket["kind"] == TicketKind.INTERACTIVE or ticket["created_at"] <= aged_before else 1
        row = await self._one(
            "SELECT COUNT(*) AS n FROM tickets t WHERE t.state = :w AND COALESCE(t.device, '') = :d AND "
            "COALESCE(t.device_class, '') = :c AND t.tags = :tags AND t.id <> :id AND "
            "(CASE WHEN t.kind = :interactive OR t.created_at <= :aged THEN 0 ELSE 1 END < :first OR "
            "(CASE WHEN t.kind = :interactive OR t.created_at <= :aged THEN 0 ELSE 1 END = :first AND "
            "(t.created_at < :at OR t.created_at = :at AND t.id < :id)))",
            w=TicketState.WAITING, d=ticket["device"] or "", c=ticket["device_class"] or "",
            tags=json.dumps(ticket["tags"]), id=ticket["id"], interactive=TicketKind.INTERACTIVE, aged=aged_before,
            first=first, at=ticket["created_at"])
        return row["n"]

    async def waiting_ticket_counts(self) -> list[dict]:
        """Waiting tickets by what they wait for (a class, or a device's) and kind."""
        return await self._all("SELECT COALESCE(t.device_class, d.class, '') AS class, t.kind AS kind, COUNT(*) AS n "
                               "FROM tickets t LEFT JOIN devices d ON d.name = t.device WHERE t.state = :w "
                               "GROUP BY COALESCE(t.device_class, d.class, ''), t.kind", w=TicketState.WAITING)

    # ---- jobs (docs/architecture.md, "Jobs and evidence") ------------------------------------

    async def insert_job(self, row: JobRow) -> None:
        await self._insert("jobs", row)

    async def job(self, job_id: str, for_update: bool = False) -> JobRow | None:
        return await self._one("SELECT * FROM jobs WHERE id = :id" + (self._for_update if for_update else ""),
                               id=job_id)

    async def jobs_of(self, user: str | None, limit: int) -> list[JobRow]:
        """The jobs ``user`` owns or works on (everyone's: None), the open ones first, newest first."""
        where = "" if user is None else "WHERE owner = :u OR worker_user = :u"
        values: dict[str, Any] = {} if user is None else {"u": user}
        return await self._all(f"SELECT * FROM jobs {where} ORDER BY CASE WHEN state IN {_OPEN_JOBS_SQL} THEN 0 "
                               "ELSE 1 END, created_at DESC, id LIMIT :n", n=limit, **values)

    async def claim_job(self, owners: list[str], worker: str, worker_user: str, now: float) -> JobRow | None:
        """The oldest queued job of one of ``owners`` becomes running, claimed by ``worker_user``;
        None if there is none. On PostgreSQL a job another claim holds is skipped."""
        where, params = self._in("owner", "owners", owners)
        lock = " FOR UPDATE SKIP LOCKED" if self.dialect == "postgresql" else ""
        oldest = await self._one(f"SELECT id FROM jobs WHERE state = :q AND {where} ORDER BY created_at, id "
                                 f"LIMIT 1{lock}", q=JobState.QUEUED, **params)
        if oldest is None:
            return None
        return await self._one("UPDATE jobs SET state = :r, worker = :w, worker_user = :wu, started_at = :now, "
                               "beat_at = :now WHERE id = :id AND state = :q RETURNING *", r=JobState.RUNNING,
                               w=worker, wu=worker_user, now=now, id=oldest["id"], q=JobState.QUEUED)

    async def queued_job_of(self, owners: list[str]) -> bool:
        """Whether a job of one of ``owners`` is queued (a read: it takes nothing)."""
        where, params = self._in("owner", "owners", owners)
        return await self._one(f"SELECT id FROM jobs WHERE state = :q AND {where} LIMIT 1", q=JobState.QUEUED,
                               **params) is not None

    async def beat_job(self, job_id: str, now: float) -> bool:
        """A running job's worker is alive; False if the job is not running."""
        row = await self._one("UPDATE jobs SET beat_at = :now WHERE id = :id AND state = :r RETURNING id",
                              now=now, id=job_id, r=JobState.RUNNING)
        return row is not None

    async def end_job(self, job_id: str, state: JobState, reason: str, now: float,
                      from_states: tuple[JobState, ...]) -> JobRow | None:
        """Move a job in one of ``from_states`` to ``state``: the job as it is now, or None if
        it was in none of them (here or in another process)."""
        marks = sql_list(from_states)
        return await self._one(f"UPDATE jobs SET state = :s, reason = :r, ended_at = :now WHERE id = :id AND "
                               f"state IN {marks} RETURNING *", s=state, r=reason, now=now, id=job_id)

    async def jobs_silent_before(self, before: float, limit: int) -> list[JobRow]:
        """Running jobs whose worker last beat before ``before``, longest silent first."""
        return await self._all("SELECT * FROM jobs WHERE state = :r AND beat_at < :b ORDER BY beat_at, id LIMIT :n",
                               r=JobState.RUNNING, b=before, n=limit)

    async def job_counts(self) -> dict[str, int]:
        """Jobs in the whole lab, by state."""
        rows = await self._all("SELECT state, COUNT(*) AS n FROM jobs GROUP BY state")
        return {r["state"]: r["n"] for r in rows}

    async def count_job(self, owner: str, limit: int | None) -> bool:
        """Count an open job of ``owner``: False, and nothing counted, at ``limit``."""
        return await self._count_up("open_jobs", owner, 1, limit)

    async def uncount_job(self, owner: str) -> None:
        await self._exec("UPDATE user_counts SET open_jobs = open_jobs - 1 WHERE name = :n", n=owner)

    async def job_lease_count(self, job_id: str) -> int:
        row = await self._one("SELECT COUNT(*) AS n FROM job_leases WHERE job = :j", j=job_id)
        return row["n"]

    async def save_job_cell(self, row: JobCellRow) -> None:
        await self._insert_many("job_cells", [row], upsert_key="job, cell")

    async def job_cells(self, job_id: str) -> list[JobCellRow]:
        return await self._all("SELECT * FROM job_cells WHERE job = :j ORDER BY cell", j=job_id)

    async def insert_job_run(self, row: JobRunRow) -> bool:
        """Append a run; False, and nothing written, if the job has one of that cell and seq."""
        columns = list(row)
        inserted = await self._one(f"INSERT INTO job_runs ({', '.join(columns)}) VALUES "
                                   f"({', '.join(':' + c for c in columns)}) ON CONFLICT DO NOTHING RETURNING seq",
                                   **row)
        return inserted is not None

    async def job_runs(self, job_id: str) -> list[JobRunRow]:
        return await self._all("SELECT * FROM job_runs WHERE job = :j ORDER BY cell, seq", j=job_id)

    async def add_job_lease(self, job_id: str, cell: int, ticket_id: str | None, lease_id: str | None,
                            now: float) -> None:
        await self._insert("job_leases", {"job": job_id, "cell": cell, "ticket_id": ticket_id, "lease_id": lease_id,
                                          "created_at": now})

    async def job_leases(self, job_id: str) -> list[JobLeaseRow]:
        """The tickets and leases ``job_id`` made, in order, with where each stands and the host
        of its device (ending them takes those hosts' locks first)."""
        return await self._all(
            "SELECT jl.cell, jl.ticket_id, t.state AS ticket_state, l.id AS lease_id, l.state AS lease_state, "
            "COALESCE(l.device, t.device) AS device, d.host AS host FROM job_leases jl "
            "LEFT JOIN tickets t ON t.id = jl.ticket_id "
            "LEFT JOIN leases l ON l.id = COALESCE(jl.lease_id, t.lease_id) "
            "LEFT JOIN devices d ON d.name = COALESCE(l.device, t.granted_device, t.device) "
            "WHERE jl.job = :j ORDER BY jl.id", j=job_id)
