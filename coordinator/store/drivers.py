"""The two drivers the same SQL runs on, and PostgreSQL's notification channel; ``Store``
(``core.py``) picks the driver by the URL.

SQLite goes through the standard library's ``sqlite3``, on the event loop's own thread, with
two long-lived connections (one writes, under a lock, since SQLite has one writer; one reads
what is committed). PostgreSQL goes through ``databases`` + asyncpg. ``databases`` opens a
new SQLite connection, with a thread of its own, for every query outside a transaction
(1.2 ms a SELECT on the benchmark machine, against 0.06 ms on a kept connection), hence a
SQLite driver of our own (docs/architecture.md, "Speed, by design").

Either driver raises ``DatabaseUnavailable`` (``outage.py``) for a database it cannot reach
or use for now, and nothing else for it."""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import sqlite3
from typing import Any, AsyncIterator, Callable, NoReturn

from .outage import Outage, postgres_gone, sqlite_unavailable

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
        self.outage = Outage("SQLite")

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

    def _reraise(self, exc: Exception) -> NoReturn:
        """``exc`` again, or ``DatabaseUnavailable`` if it says the database cannot be used for now."""
        if not sqlite_unavailable(exc):
            raise exc
        assert isinstance(exc, sqlite3.OperationalError)
        raise self.outage.refuse(exc, "the lab's database is locked by another process" if self._busy(exc) else
                                 "the lab's database cannot be read or written (its disk failed, or is full)") from exc

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
        try:
            if in_tx:
                rows = [dict(r) for r in self.writer.execute(sql, values)]
            else:
                try:  # (_unlocked spelt out: a coroutine less on the path of every read)
                    rows = [dict(r) for r in self.reader.execute(sql, values)]
                except sqlite3.OperationalError as exc:
                    if not self._busy(exc):
                        raise
                    rows = await self._retried(lambda: [dict(r) for r in self.reader.execute(sql, values)])
        except sqlite3.OperationalError as exc:
            self._reraise(exc)
        return rows  # (a read says nothing of the writer's lock: a commit ends an outage)

    async def execute(self, sql: str, values: dict) -> None:
        try:
            self.writer.execute(sql, values)
        except sqlite3.OperationalError as exc:
            self._reraise(exc)

    async def insert_many(self, table: str, columns: list[str], conflict: str, rows: list[dict]) -> None:
        # one statement prepared once, run per row: sqlite3 binds a name in time linear in
        # the number of names, so one multi-row INSERT of 1000 rows took 0.9 s here
        marks = ", ".join(f":{c}" for c in columns)
        try:
            self.writer.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks}){conflict}", rows)
        except sqlite3.OperationalError as exc:
            self._reraise(exc)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        async with self.lock:
            try:
                await self._unlocked(lambda: self.writer.execute("BEGIN IMMEDIATE"))
            except sqlite3.OperationalError as exc:
                self._reraise(exc)
            try:
                yield
                await self._unlocked(lambda: self.writer.execute("COMMIT"))
            except BaseException as exc:
                if self.writer.in_transaction:  # (a commit that failed leaves it open)
                    with contextlib.suppress(sqlite3.Error):  # (the disk that failed it may fail this too)
                        self.writer.execute("ROLLBACK")
                if isinstance(exc, sqlite3.OperationalError):
                    self._reraise(exc)
                raise
        if self.outage.since is not None:
            self.outage.answered()


class PostgreSQL:
    """PostgreSQL: ``databases`` keeps the asyncpg pool, each task's connection and the
    transactions; statements go to asyncpg itself, on the task's connection (inside a
    transaction, the transaction's). Through ``databases`` each statement was compiled by
    SQLAlchemy again (122 µs of CPU a statement against 20 µs), and every connection handed
    back to the pool was reset with four statements of its own: bench/capacity.py measured
    both.

    ``databases`` counts a task's holds on its connection and hands the connection back to
    the pool when the last is let go of. A transaction holds it from its BEGIN to its COMMIT
    or ROLLBACK, but a BEGIN, COMMIT or ROLLBACK that raises (the connection lost in a
    restart of PostgreSQL, a COMMIT the server refuses, the task cancelled meanwhile) leaves
    its hold counted for good: the task stays on that connection, dead or not, for every
    statement after (the reaper failed every pass after a restart), and the pool never gets
    it back. So this driver holds the task's connection itself around each transaction and
    each statement, and lets go of it whatever happened, and of the hold such a failure left
    too; a connection whose state is not known (lost, a step cut short, still in a
    transaction) is terminated first, so that asyncpg frees its place in the pool at once and
    nobody is handed it again."""

    LOST = "the coordinator lost its connection to the lab's database (it is restarting, or unreachable)"

    def __init__(self, url: str):
        import asyncpg
        import databases

        class Connection(asyncpg.Connection):
            def get_reset_query(self) -> str:
                return ""  # the coordinator keeps no session state (its LISTEN has a connection of its own)

        # (``databases`` reads the pool's min_size, max_size and ssl from the URL's query)
        self.db = databases.Database(url, connection_class=Connection)
        self.outage = Outage("PostgreSQL")

    async def connect(self) -> None:
        await self.db.connect()

    async def disconnect(self) -> None:
        await self.db.disconnect()

    def _reraise(self, exc: BaseException, raw: Any = None) -> NoReturn:
        """``exc`` again, or ``DatabaseUnavailable`` if it says the server is away or the
        connection (``raw``, asyncpg's, if it had one) was lost: then that connection is
        terminated, never handed out again."""
        if not isinstance(exc, Exception) or not postgres_gone(exc, raw is not None and _closed(raw)):
            raise exc
        if raw is not None:
            _drop(raw)
        raise self.outage.refuse(exc, self.LOST) from exc

    async def _hold(self) -> Any:
        """This task's connection (``databases``'), held once more: taken from the pool at
        the first hold, so inside a transaction it is the transaction's."""
        connection = self.db.connection()
        try:
            await connection.__aenter__()
        except Exception as exc:  # (connecting afresh: refused, or the server is starting)
            self._reraise(exc)
        return connection

    async def _step_failed(self, connection: Any, exc: BaseException, ended: bool) -> bool:
        """``databases``' BEGIN, COMMIT or ROLLBACK on ``connection`` raised ``exc`` and left
        its hold counted: let go of it, the raw connection terminated first unless the step
        ``ended`` the transaction, the server answered it itself and the connection is out of
        any transaction (a COMMIT the server refuses ends the transaction; a BEGIN that failed
        leaves asyncpg's connection believing one is open). Whether ``exc`` says the
        connection was lost."""
        import asyncpg

        raw = connection.raw_connection
        gone = isinstance(exc, Exception) and postgres_gone(exc, _closed(raw))
        if gone or not ended or not isinstance(exc, asyncpg.PostgresError) or _closed(raw) or \
                raw.is_in_transaction():
            _drop(raw)
        await connection.__aexit__()  # (ours still holds it: this hands nothing back yet)
        return gone

    async def _statement(self, method: str, sql: str, values: dict) -> Any:
        """``method`` (asyncpg's ``fetch`` or ``execute``) of ``sql`` on this task's connection."""
        text, names = _positional(sql)
        connection = await self._hold()
        try:
            raw = connection.raw_connection
            try:
                result = await getattr(raw, method)(text, *(values[n] for n in names))
            except Exception as exc:
                self._reraise(exc, raw)
        finally:
            await connection.__aexit__()
        if self.outage.since is not None:
            self.outage.answered()
        return result

    async def fetch(self, sql: str, values: dict, in_tx: bool) -> list[dict]:
        return [dict(r) for r in await self._statement("fetch", sql, values)]  # (``databases`` knows the task's)

    async def execute(self, sql: str, values: dict) -> None:
        await self._statement("execute", sql, values)

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

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """One transaction of ``databases`` on this task's connection, which is held around it
        and let go of whatever happens (the class's docstring says why)."""
        connection = await self._hold()
        try:
            transaction = connection.transaction()
            try:
                await transaction.start()
            except BaseException as exc:
                if await self._step_failed(connection, exc, ended=False):
                    raise self.outage.refuse(exc, self.LOST) from exc
                raise
            try:
                yield
            except BaseException:
                try:
                    await transaction.rollback()
                except BaseException as exc:
                    await self._step_failed(connection, exc, ended=True)
                    if not isinstance(exc, Exception):
                        raise  # (cancelled meanwhile)
                raise  # the body's error is the one told (a lost connection: the server rolled it back)
            try:
                await transaction.commit()
            except BaseException as exc:
                if await self._step_failed(connection, exc, ended=True):
                    raise self.outage.refuse(exc, self.LOST) from exc
                raise
        finally:
            await connection.__aexit__()
        if self.outage.since is not None:
            self.outage.answered()


def _drop(raw: Any) -> None:
    """Terminate asyncpg's connection ``raw`` at once: the pool frees its place (and detaches
    it from whoever held it), and it is never handed out again."""
    if not _closed(raw):
        raw.terminate()


def _closed(raw: Any) -> bool:
    """Whether asyncpg's connection ``raw`` (the pool's) is closed (one that closed was handed
    back to the pool at once, and then answers nothing)."""
    try:
        return raw.is_closed()
    except Exception:  # asyncpg: "connection has been released back to the pool"
        return True


def connect_arguments(url: str) -> dict[str, Any]:
    """``asyncpg.connect``'s arguments for ``url``, as ``databases`` gives them to its pool:
    the server, account and database, and the ``ssl`` of the URL's query (true, false or a
    mode). Its ``min_size`` and ``max_size`` are the pool's alone, and ``databases`` reads
    nothing else of the query: the notification channel's own connection reaches the server
    as the pool's do."""
    import databases

    parsed = databases.DatabaseURL(url)
    arguments: dict[str, Any] = {"host": parsed.hostname, "port": parsed.port, "user": parsed.username,
                                 "password": parsed.password, "database": parsed.database}
    ssl = parsed.options.get("ssl")
    if ssl is not None:
        arguments["ssl"] = {"true": True, "false": False}.get(ssl.lower(), ssl.lower())
    return arguments


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
        self.arguments = connect_arguments(url)
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

        self.connection = await asyncpg.connect(**self.arguments)
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
                log.debug("PostgreSQL notification channel: %s; retrying", exc)  # (the loss was told once)
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

