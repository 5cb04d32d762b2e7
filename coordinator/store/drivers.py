"""The two drivers the same SQL runs on, and PostgreSQL's notification channel; ``Store``
(``core.py``) picks the driver by the URL.

SQLite goes through the standard library's ``sqlite3``, on the event loop's own thread, with
two long-lived connections (one writes, under a lock, since SQLite has one writer; one reads
what is committed). PostgreSQL goes through ``databases`` + asyncpg. ``databases`` opens a
new SQLite connection, with a thread of its own, for every query outside a transaction
(1.2 ms a SELECT on the benchmark machine, against 0.06 ms on a kept connection), hence a
SQLite driver of our own (docs/architecture.md, "Speed, by design")."""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import sqlite3
from typing import Any, AsyncIterator, Callable

log = logging.getLogger(__name__)

CHANNEL = "device_loop"  # PostgreSQL notifications: the keys a commit changed, one a line
_MAX_PARAMS = 30_000  # per statement: SQLite allows 32766, asyncpg 32767



class SQLite:
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
    async def transaction(self) -> AsyncIterator[None]:
        async with self.lock:
            await self._unlocked(lambda: self.writer.execute("BEGIN IMMEDIATE"))
            try:
                yield
                await self._unlocked(lambda: self.writer.execute("COMMIT"))
            except BaseException:
                if self.writer.in_transaction:  # (a commit that failed leaves it open)
                    self.writer.execute("ROLLBACK")
                raise


class Databases:
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

    def transaction(self) -> Any:
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


class Listener:
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

    def _lost(self, _connection: Any) -> None:
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

