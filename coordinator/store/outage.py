"""A database the coordinator cannot reach for now, on either driver: which of their errors
say so, the one exception the store raises for them all (``DatabaseUnavailable``: routes
answer it 503 with Retry-After, tools in words), and the outage told once in the log, when
it begins and when it ends, not at every call it refuses."""
from __future__ import annotations

import logging
import sqlite3
import time

log = logging.getLogger(__name__)

# What a refusal asks a client to wait: the next call connects afresh (a restart of
# PostgreSQL took 0.4 s here under a storm of calls), and the notification channel is tried
# again each second (drivers.Listener.RETRY_S).
RETRY_AFTER_S = 1

AGAIN = "ask again in a moment (with the same Idempotency-Key, a change is made once)"

# PostgreSQL's SQLSTATEs for a connection that is gone or refused: the connection
# exceptions (class 08) but a protocol violation, which is a bug; the server shutting down,
# crashed or still starting (57P01-57P03); no connection slot left (53300).
_POSTGRES_GONE = {"08000", "08001", "08003", "08004", "08006", "57P01", "57P02", "57P03", "53300"}

# SQLite's primary result codes for a database that cannot be used for now: locked by another
# process past the driver's deadline, a read or write the disk failed, a full disk, a file
# that cannot be opened.
_SQLITE_UNAVAILABLE = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN}


class DatabaseUnavailable(Exception):
    """The database cannot be reached or used for now (a restart, a failover, a lock held
    too long by another process, a failing or full disk): the call was not carried out, or,
    when the connection was lost while it committed, perhaps it was: a repeat with the same
    Idempotency-Key tells which. ``str()`` says it in words a caller may read (no address,
    no driver's text: those are in the log)."""

    retry_after_s = RETRY_AFTER_S


def postgres_gone(exc: BaseException, connection_closed: bool = False) -> bool:
    """Whether asyncpg's (or the OS's) ``exc`` says the server is away or the connection
    lost; ``connection_closed``: the connection the statement ran on is closed now (asyncpg
    then raises its own ``InterfaceError`` for it)."""
    import asyncpg

    if isinstance(exc, OSError):  # refused, reset, timed out: connecting or mid-call
        return True
    if isinstance(exc, asyncpg.PostgresError):
        return exc.sqlstate in _POSTGRES_GONE
    if isinstance(exc, asyncpg.InterfaceError):
        return connection_closed
    # asyncpg out of step with its connection: a pooled connection whose server said goodbye
    # (57P01) while it was idle, taken before the close that follows is read, refuses the
    # statement ("another operation is in progress") before sending it
    return isinstance(exc, asyncpg.exceptions.InternalClientError)


def sqlite_unavailable(exc: BaseException) -> bool:
    """Whether sqlite3's ``exc`` says the database cannot be used for now."""
    return isinstance(exc, sqlite3.OperationalError) and exc.sqlite_errorcode & 0xFF in _SQLITE_UNAVAILABLE


class Outage:
    """Whether ``what`` (a database) answers, as the calls find it. The first call that finds
    it gone logs why (the driver's own error); once a call succeeds ``QUIET_S`` after the last
    refused one, it is back: logged with how long it was gone and the calls refused meanwhile
    (a restart's first seconds mix both: they are one outage, not a line a call)."""

    QUIET_S = 2.0

    def __init__(self, what: str):
        self.what = what
        self.since: float | None = None  # (monotonic) when the outage began; None: none now
        self.last_refused = 0.0
        self.refused = 0

    def refuse(self, exc: BaseException, words: str) -> DatabaseUnavailable:
        """The exception to raise for ``exc``, which says the database is gone; logged
        once an outage."""
        now = time.monotonic()
        if self.since is None:
            self.since, self.refused = now, 0
            log.warning("%s is unavailable (%s: %s); calls are refused (503) until it is back", self.what,
                        type(exc).__name__, exc)
        self.last_refused = now
        self.refused += 1
        return DatabaseUnavailable(f"{words}; {AGAIN}")

    def answered(self) -> None:
        """A call succeeded (the driver calls it only while ``since`` is set)."""
        now = time.monotonic()
        if self.since is not None and now - self.last_refused >= self.QUIET_S:
            log.warning("%s is back after %.1f s; %d calls were refused meanwhile", self.what,
                        self.last_refused - self.since, self.refused)
            self.since = None
