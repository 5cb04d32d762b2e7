"""The databases of the tests' labs, made cheap: on PostgreSQL, one database of each
process's (a pytest worker's) at the latest migration, reset between its labs to what a
fresh copy holds; on SQLite, a copy of a file migrated once a process."""
from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import os
import shutil
import sqlite3
import tempfile
import uuid
from pathlib import Path

from device_loop.coordinator.store.core import Store


def database_url(admin_url: str, name: str) -> str:
    """The URL of database ``name`` on ``admin_url``'s server."""
    return f"{admin_url.rsplit('/', 1)[0]}/{name}"


#: admin URL -> a database of this process's at the latest migration, which the other
#: databases of its labs copy (CREATE DATABASE ... TEMPLATE): running the migrations into each
#: new PostgreSQL database took 1.5-4.5 s a test beside the rest of the suite, copying one
#: 0.3-0.5 s (0.14 s against 0.03-0.07 s on a quiet machine). Each process migrates its own
#: template once (from empty, as a coordinator does); a test of the migrations themselves
#: takes an empty database (``lab_in_process._database``).
_TEMPLATES: dict[str, str] = {}

#: admin URL -> what its template holds right after the migrations, which a database of
#: this process's is reset to before each lab (``take_migrated_database``).
_FRESH: dict[str, FreshState] = {}

#: admin URL -> the migrated databases of this process no lab uses now. A lab takes one and
#: resets it, or copies the template if none is free (a lab inside a lab): so a process (a
#: pytest worker) keeps one such database for its labs one after another, where a database
#: copied and dropped for each took 0.25 s of the server's CPU, and ten server processes more.
_FREE: dict[str, list[str]] = {}

#: The names of every database this process made, dropped when it exits.
_MADE: dict[str, list[str]] = {}

# One line for each object of the database's own schemas, and for its own settings: two
# databases whose lines are the same have the same schema, whatever their objects' oids.
# A test that changed the schema (dropped a column to play an older version, made a
# table, a trigger, a function) leaves lines of its own: such a database is dropped.
SCHEMA_FINGERPRINT = """
WITH ours AS (
    SELECT oid FROM pg_namespace
    WHERE nspname NOT IN ('pg_catalog', 'information_schema') AND nspname !~ '^pg_(toast|temp_|toast_temp_)'
), lines(line) AS (
    SELECT format('database %s %s %s', datallowconn, datconnlimit, datacl) FROM pg_database
        WHERE datname = current_database()
    UNION ALL SELECT format('setting %s %s', setrole, setconfig) FROM pg_db_role_setting
        WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
    UNION ALL SELECT format('schema %s %s %s', nspname, nspowner::regrole, nspacl) FROM pg_namespace
        WHERE oid IN (SELECT oid FROM ours)
    UNION ALL SELECT format('relation %s %s %s %s %s %s %s', c.oid::regclass, c.relkind, c.relowner::regrole,
                            c.relacl, c.relrowsecurity, c.relpersistence, c.reloptions) FROM pg_class c
        WHERE c.relnamespace IN (SELECT oid FROM ours)
    UNION ALL SELECT format('column %s %s %s %s %s %s %s %s %s', a.attrelid::regclass, a.attnum, a.attname,
                            format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attisdropped, a.attidentity,
                            a.attgenerated, pg_get_expr(d.adbin, d.adrelid))
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace IN (SELECT oid FROM ours) AND a.attnum > 0
    UNION ALL SELECT format('index %s', pg_get_indexdef(i.indexrelid)) FROM pg_index i
        JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relnamespace IN (SELECT oid FROM ours)
    UNION ALL SELECT format('constraint %s %s %s', conrelid::regclass, conname, pg_get_constraintdef(oid))
        FROM pg_constraint WHERE connamespace IN (SELECT oid FROM ours)
    UNION ALL SELECT format('trigger %s', pg_get_triggerdef(oid)) FROM pg_trigger WHERE NOT tgisinternal
    UNION ALL SELECT format('event trigger %s', evtname) FROM pg_event_trigger
    UNION ALL SELECT format('rule %s', pg_get_ruledef(r.oid)) FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class
        WHERE c.relnamespace IN (SELECT oid FROM ours)
    UNION ALL SELECT format('policy %s %s', polrelid::regclass, polname) FROM pg_policy
    UNION ALL SELECT format('function %s %s', p.oid::regprocedure, md5(p.prosrc)) FROM pg_proc p
        WHERE p.pronamespace IN (SELECT oid FROM ours)
    UNION ALL SELECT format('type %s %s', t.oid::regtype, t.typtype) FROM pg_type t
        WHERE t.typnamespace IN (SELECT oid FROM ours)
    UNION ALL SELECT format('statistics %s', stxname) FROM pg_statistic_ext WHERE stxnamespace IN (SELECT oid FROM ours)
    UNION ALL SELECT format('sequence %s %s %s %s %s %s', seqrelid::regclass, seqtypid::regtype, seqstart,
                            seqincrement, seqmin, seqmax) || seqcycle FROM pg_sequence
    UNION ALL SELECT format('extension %s %s', extname, extversion) FROM pg_extension
    UNION ALL SELECT format('publication %s', pubname) FROM pg_publication
    UNION ALL SELECT format('large objects %s', count(*)) FROM pg_largeobject_metadata
)
SELECT md5(string_agg(line, E'\\n' ORDER BY line)) FROM lines
"""

# Every table (its schema and name) and sequence (quoted) of the database's own schemas.
_TABLES = ("SELECT schemaname, tablename FROM pg_tables "
           "WHERE schemaname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2")
# The tables of the database's own schemas that anything was written to, or that were vacuumed
# or analyzed, since they were made or last emptied (TRUNCATE makes a table's files anew, and
# forgets its pages and rows counted): what their planner statistics say too, as a test's
# plans would follow them (an order of rows the query leaves open, say).
_TOUCHED = """
SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND n.nspname NOT IN ('pg_catalog', 'information_schema')
AND (pg_relation_size(c.oid) > 0 OR c.relpages <> 0 OR c.reltuples <> -1 OR c.relallvisible <> 0
     OR EXISTS (SELECT 1 FROM pg_statistic s WHERE s.starelid = c.oid))
"""
_STATISTICS = ("SELECT starelid FROM pg_statistic WHERE starelid IN (SELECT c.oid FROM pg_class c JOIN pg_namespace n "
               "ON n.oid = c.relnamespace WHERE n.nspname NOT IN ('pg_catalog', 'information_schema'))")
_SEQUENCES = ("SELECT format('%I.%I', schemaname, sequencename) FROM pg_sequences "
              "WHERE schemaname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1")


@dataclasses.dataclass(frozen=True)
class FreshState:
    """What a database holds right after the migrations ran on it (its template's), and so
    what a reset leaves in it: its schema, the rows the migrations themselves inserted
    (``schema_migrations``' versions), each sequence's state; no planner statistics (nothing
    analyzed it) and no counts of what was read or written (a new database has none)."""

    schema: str  # SCHEMA_FINGERPRINT's
    tables: tuple[tuple[str, str], ...]  # (schema, name)
    seeded: dict[tuple[str, str], list[tuple]]  # table -> the rows the migrations left in it (if any)
    sequences: dict[str, tuple[int, bool]]  # sequence (quoted) -> (last_value, is_called), as setval() takes them

    @staticmethod
    async def of(connection) -> FreshState:
        """The state of the database of asyncpg's ``connection``."""
        tables = tuple((r[0], r[1]) for r in await connection.fetch(_TABLES))
        seeded = {t: [tuple(r) for r in rows] for t in tables
                  if (rows := await connection.fetch(f"SELECT * FROM {_quoted(*t)}"))}
        touched = {(r[0], r[1]) for r in await connection.fetch(_TOUCHED)}
        assert touched <= seeded.keys() and not await connection.fetch(_STATISTICS), \
            "a reset empties the tables written to and forgets every planner statistic: the migrations left some"
        sequences = {s: (row[0], row[1]) for s in [r[0] for r in await connection.fetch(_SEQUENCES)]
                     if (row := await connection.fetchrow(f"SELECT last_value, is_called FROM {s}"))}
        return FreshState(await connection.fetchval(SCHEMA_FINGERPRINT), tables, seeded, sequences)

    def sequence_states(self) -> str:
        """SQL: each sequence's index in ``sequences``, last value and is_called."""
        return " UNION ALL ".join(f"SELECT {n}, last_value, is_called FROM {s}" for n, s in enumerate(self.sequences))


def _quoted(schema: str, name: str) -> str:
    return ".".join('"' + part.replace('"', '""') + '"' for part in (schema, name))


async def migrated_template(admin_url: str) -> str:
    """The name of this process's migrated template database on ``admin_url``'s server
    (made at the first call, with what it holds then kept as ``_FRESH[admin_url]``; dropped
    when the process exits). No connection to it is left open: PostgreSQL copies only a
    database nobody is connected to."""
    if admin_url not in _TEMPLATES:
        import asyncpg

        name = await _create(admin_url, "template", "")
        store = Store(database_url(admin_url, name) + "?min_size=1&max_size=1")  # (one migration at a time)
        await store.connect()
        await store.disconnect()
        connection = await asyncpg.connect(database_url(admin_url, name))
        try:
            _FRESH[admin_url] = await FreshState.of(connection)
        finally:
            await connection.close()
        _TEMPLATES[admin_url] = name
    return _TEMPLATES[admin_url]


async def _create(admin_url: str, kind: str, template: str) -> str:
    """A new database on ``admin_url``'s server (a copy of ``template``, if named), dropped
    when this process exits: its name, which says the pytest worker that made it."""
    import asyncpg

    name = f"{kind}_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
    finally:
        await admin.close()
    if admin_url not in _MADE:
        _MADE[admin_url] = []
        atexit.register(lambda: asyncio.run(_drop_all(admin_url)))
    _MADE[admin_url].append(name)
    return name


async def _drop(admin_url: str, name: str) -> None:
    import asyncpg

    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.close()
    if name in _MADE.get(admin_url, []):
        _MADE[admin_url].remove(name)


async def _drop_all(admin_url: str) -> None:
    for name in list(_MADE[admin_url]):
        await _drop(admin_url, name)


async def take_migrated_database(admin_url: str) -> str:
    """A database of this process's at the latest migration, holding what a fresh copy of the
    template holds and nothing else, that no one else uses until ``give_back``: one given
    back before, reset (``_reset``), or a new copy of the template. Its name."""
    template = await migrated_template(admin_url)
    free = _FREE.setdefault(admin_url, [])
    while free:
        name = free.pop()
        if await _reset(database_url(admin_url, name), _FRESH[admin_url]):
            return name
        await _drop(admin_url, name)  # (WITH FORCE: a process still on it is cut off for good)
    return await _create(admin_url, "lab", template)


def give_back(admin_url: str, name: str) -> None:
    """Database ``name`` (``take_migrated_database``'s) is free for the next lab, which resets it first."""
    _FREE.setdefault(admin_url, []).append(name)


async def _reset(url: str, fresh: FreshState) -> bool:
    """Bring the database at ``url`` back to ``fresh``: nobody else's session left on it
    (their LISTENs, advisory locks, temporary tables and prepared statements end with them),
    no row but the migrations' own, every sequence where the migrations left it. False when
    it cannot be: a session on it whose client is still there (a process of an earlier test
    still running: it would go on writing, and connect again), a schema that is not the
    migrations' (a test took the database back to an older version, or added to it), or
    no connection to it (a test forbade them, or dropped it)."""
    import asyncpg

    try:
        connection = await asyncpg.connect(url)
    except (OSError, asyncpg.PostgresError):
        return False
    try:
        others = await connection.fetch(
            "SELECT pid, client_port FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()")
        held = _held_local_ports()
        if any(o["client_port"] is None or o["client_port"] < 0 or o["client_port"] in held for o in others):
            return False
        for other in others:  # (their clients are gone: they are on their way out)
            await connection.execute("SELECT pg_terminate_backend($1, 10000)", other["pid"])
        if await connection.fetchval(
                "SELECT (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND backend_type = 'client backend' AND pid <> pg_backend_pid()) "
                "+ (SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database())"):
            return False
        if await connection.fetchval(SCHEMA_FINGERPRINT) != fresh.schema:
            return False
        touched = {(r[0], r[1]) for r in await connection.fetch(_TOUCHED)}
        async with connection.transaction():
            emptied = sorted(touched | fresh.seeded.keys())
            if emptied:
                # (CASCADE: with the tables whose foreign keys point at these, empty or not)
                await connection.execute(f"TRUNCATE {', '.join(_quoted(*t) for t in emptied)} RESTART IDENTITY CASCADE")
            for (schema, table), rows in fresh.seeded.items():
                await connection.copy_records_to_table(table, schema_name=schema, records=rows)
            names = list(fresh.sequences)
            for n, last_value, is_called in await connection.fetch(fresh.sequence_states()) if names else ():
                if (last_value, is_called) != fresh.sequences[names[n]]:
                    await connection.execute("SELECT setval($1::regclass, $2, $3)", names[n],
                                             *fresh.sequences[names[n]])
            await connection.execute(f"DELETE FROM pg_statistic WHERE starelid IN ({_STATISTICS})")
        # the counts of what was read and written, which autovacuum goes by, are zero as in a
        # new database: this session's own counts (the copy above) sent first, then all reset
        await connection.execute("SELECT pg_stat_force_next_flush()")
        await connection.execute("SELECT pg_stat_reset()")
        return True
    finally:
        await connection.close()


def _held_local_ports() -> set[int]:
    """The local ports of this machine's TCP sockets that a process holds (a socket whose
    process exited is left to the kernel, with no inode, until its connection ends)."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[9] != "0":
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


_SQLITE_TEMPLATE: dict[str, Path] = {}


async def migrated_sqlite_template() -> Path:
    """This process's SQLite file at the latest migration (made at the first call, from
    empty as a coordinator makes it; removed when the process exits), in one file that a
    plain copy takes whole: 30 migrations ran into each lab's file before."""
    if "path" not in _SQLITE_TEMPLATE:
        from leftovers import RUN_TMP  # (in the run's folder: a worker killed outright leaves none in /tmp)

        folder = Path(tempfile.mkdtemp(prefix="device-loop-template-", dir=os.environ.get(RUN_TMP)))
        atexit.register(shutil.rmtree, folder, True)
        path = folder / "migrated.sqlite"
        store = Store(f"sqlite:///{path}")
        await store.connect()
        await store.disconnect()
        with contextlib.closing(sqlite3.connect(path)) as connection:
            connection.execute("PRAGMA journal_mode = DELETE")  # (the WAL checkpointed into the file, and gone)
        _SQLITE_TEMPLATE["path"] = path
    return _SQLITE_TEMPLATE["path"]
