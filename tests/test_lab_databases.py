"""The labs of one process take turns on one PostgreSQL database (tests/lab_databases.py): each
lab starts on what a database the migrations just made holds, whatever the lab before it left
(rows, sequences, a session still running, a changed schema), and never on a database
something else still uses. On SQLite each lab's file is a copy of one migrated file, which
holds what a file migrated from empty does."""
from __future__ import annotations

import asyncio

import pytest

import lab_in_process
from device_loop.coordinator.identity import issue_token
from device_loop.coordinator.store.core import Store
from lab_databases import SCHEMA_FINGERPRINT, database_url
from lab_in_process import FakeExporter, _database, device, in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


async def contents(store: Store) -> dict:
    """Everything a database holds that a lab could see: its schema, every table's rows
    (sorted), every sequence's state; on PostgreSQL what the planner goes by too (each
    table's pages and rows as last counted, its statistics)."""
    if store.dialect == "sqlite":
        schema = [tuple(r.values()) for r in await store.read(
            "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name")]
        tables = [r["name"] for r in await store.read("SELECT name FROM sqlite_master WHERE type = 'table'")]
        sequences: dict = {}  # (sqlite_sequence is a table: its rows are the sequences)
        planner: list = []
    else:
        schema = (await store.read(SCHEMA_FINGERPRINT))[0]["md5"]
        tables = [r["t"] for r in await store.read(
            "SELECT format('%I.%I', schemaname, tablename) AS t FROM pg_tables "
            "WHERE schemaname NOT IN ('pg_catalog', 'information_schema')")]
        named = await store.read("SELECT format('%I.%I', schemaname, sequencename) AS s FROM pg_sequences "
                                 "WHERE schemaname NOT IN ('pg_catalog', 'information_schema')")
        sequences = {r["s"]: tuple((await store.read(f"SELECT last_value, is_called FROM {r['s']}"))[0].values())
                     for r in named}
        planner = [tuple(r.values()) for r in await store.read(
            "SELECT c.relname, c.relpages, c.reltuples, c.relallvisible, "
            "(SELECT count(*) FROM pg_statistic s WHERE s.starelid = c.oid) AS statistics FROM pg_class c "
            "WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r' ORDER BY c.relname")]
    rows = {t: sorted(repr(tuple(r.values())) for r in await store.read(f"SELECT * FROM {t}")) for t in sorted(tables)}
    return {"schema": schema, "rows": rows, "sequences": sequences} | ({"planner": planner} if planner else {})


async def fresh_contents(tmp_path) -> dict:
    """What a database the migrations just made holds: an empty one, migrated by a Store as a
    coordinator's first start does."""
    folder = tmp_path / "fresh"
    folder.mkdir(exist_ok=True)
    async with _database(folder) as url:
        store = Store(url)
        await store.connect()
        try:
            return await contents(store)
        finally:
            await store.disconnect()


async def which(rules) -> str:
    """The database a lab is on: its PostgreSQL database's name, or its SQLite file."""
    store = rules.store
    if store.dialect == "sqlite":
        return store.driver.path
    return (await store.read("SELECT current_database() AS name"))[0]["name"]


async def connect(name: str):
    """asyncpg's connection to database ``name`` of the labs' PostgreSQL server."""
    import asyncpg

    admin = lab_in_process.POSTGRES["admin_url"]
    assert admin
    return await asyncpg.connect(database_url(admin, name))


async def fill(client, rules, clock) -> None:
    """Rows in most tables: hosts, devices, resources, their ring log, leases, the audit (a
    sequence), counts, idempotency keys, tokens, and an image (a table a foreign key of
    known_good's points at: PostgreSQL empties it only with known_good); every table analyzed,
    as autovacuum does once enough rows changed; on PostgreSQL a table emptied and vacuumed
    (empty, but no longer as the migrations left it: its rows counted, 0)."""
    api = client("alice")
    await FakeExporter(api, "host-a").beat([device("b0"), device("b1")])
    assert (await api.post("/leases", json={"device": "b0"}, headers={"Idempotency-Key": "k1"})).status_code == 201
    await issue_token(rules.store, clock, "alice")
    await rules.store.run("INSERT INTO images (sha256, name, size, description, target, uploader, created_at, "
                          "last_used_at) VALUES ('0' || :sha, 'build-1', 1, '', 'class:sim-board', 'alice', 0, 0)",
                          sha="f" * 63)
    await rules.store.run("ANALYZE")
    if rules.store.dialect == "postgresql":
        await rules.store.run("INSERT INTO candidates (identifier, host, kind, plugin, label, last_seen) "
                              "VALUES ('c', 'host-a', 'uart', 'sim', '', 0)")
        await rules.store.run("DELETE FROM candidates")
        vacuum = await connect(await which(rules))
        try:
            await vacuum.execute("VACUUM candidates")  # (never inside a transaction, where the store runs all)
        finally:
            await vacuum.close()


@pytest.mark.usefixtures("database")
async def test_the_next_lab_sees_nothing_of_the_last(tmp_path):
    fresh = await fresh_contents(tmp_path)
    (tmp_path / "one").mkdir()
    async with in_process_lab(tmp_path / "one") as (client, rules, clock):
        first = await which(rules)
        await fill(client, rules, clock)
        left = await contents(rules.store)
        assert left["rows"] != fresh["rows"], "the lab wrote nothing"
        assert left.get("planner") != fresh.get("planner") or rules.store.dialect == "sqlite", "nor was analyzed"
        assert rules.store.dialect == "sqlite" or left["sequences"] != fresh["sequences"], "nor drew from a sequence"
    (tmp_path / "two").mkdir()
    async with in_process_lab(tmp_path / "two") as (client, rules, clock):
        if rules.store.dialect == "postgresql":
            assert await which(rules) == first, "the next lab of this process reuses its database (else no reset ran)"
        assert await contents(rules.store) == fresh
        assert (await client().get("/devices")).json() == []
        assert (await client().get("/leases")).json() == []


@pytest.mark.parametrize("database", ["postgresql"], indirect=True)
async def test_a_session_left_running_on_the_database_ends_before_the_next_lab(tmp_path, database):
    """A session whose client is gone but whose statement still runs (a process killed in the
    middle of one: the server notices only when it next talks to it) holds its locks and its
    LISTEN: the next lab starts without it."""
    import asyncpg

    (tmp_path / "one").mkdir()
    async with in_process_lab(tmp_path / "one") as (client, rules, clock):
        first = await which(rules)
        orphan = await connect(first)
        await orphan.execute("LISTEN device_loop")
        await orphan.execute("SELECT pg_advisory_lock(42)")
        pid = orphan.get_server_pid()
        sleeping = asyncio.ensure_future(orphan.execute("SELECT pg_sleep(60)"))
        while not (await rules.store.read("SELECT count(*) AS n FROM pg_stat_activity WHERE pid = :pid AND "
                                          "query LIKE '%pg_sleep%' AND state = 'active'", pid=pid))[0]["n"]:
            await asyncio.sleep(0.01)  # (polling the condition)
        orphan.terminate()  # the client's end closed, the server's still in pg_sleep
        sleeping.cancel()
        with pytest.raises((asyncio.CancelledError, asyncpg.InterfaceError, ConnectionError)):
            await sleeping
        assert not (await rules.store.read("SELECT pg_try_advisory_xact_lock(42) AS free"))[0]["free"]
    (tmp_path / "two").mkdir()
    async with in_process_lab(tmp_path / "two") as (client, rules, clock):
        assert await which(rules) == first, "the session's client is gone: its database is reset and reused"
        assert (await rules.store.read("SELECT count(*) AS n FROM pg_stat_activity WHERE pid = :pid",
                                       pid=pid))[0]["n"] == 0
        assert (await rules.store.read("SELECT pg_try_advisory_xact_lock(42) AS free"))[0]["free"]


@pytest.mark.parametrize("database", ["postgresql"], indirect=True)
async def test_a_database_something_still_uses_is_never_reset_under_it(tmp_path, database):
    """A client still connected when its test ended (a coordinator process of that test still
    running, a connection it leaked) could go on writing: the next lab gets another database,
    and that one is dropped, which cuts the client off."""
    import asyncpg

    fresh = await fresh_contents(tmp_path)
    (tmp_path / "one").mkdir()
    async with in_process_lab(tmp_path / "one") as (client, rules, clock):
        first = await which(rules)
        await fill(client, rules, clock)
        still = await connect(first)
    try:
        (tmp_path / "two").mkdir()
        async with in_process_lab(tmp_path / "two") as (client, rules, clock):
            assert await which(rules) != first
            assert await contents(rules.store) == fresh
        with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, ConnectionError)):
            await still.fetchval("SELECT count(*) FROM devices")  # (its database is gone)
    finally:
        still.terminate()


@pytest.mark.parametrize("database", ["postgresql"], indirect=True)
async def test_a_database_whose_schema_a_lab_changed_is_not_reused(tmp_path, database):
    """A test that takes the schema back to an older version (tests/test_jobs_store.py) or adds
    to it leaves a database no reset makes fresh again: the next lab gets a new copy."""
    fresh = await fresh_contents(tmp_path)
    (tmp_path / "one").mkdir()
    async with in_process_lab(tmp_path / "one") as (client, rules, clock):
        first = await which(rules)
        await rules.store.run("ALTER TABLE hosts DROP COLUMN address")
        await rules.store.run("ALTER TABLE hosts ADD COLUMN address TEXT")  # (the same columns: another order)
        await rules.store.run("CREATE TABLE probe (k INTEGER)")
    (tmp_path / "two").mkdir()
    async with in_process_lab(tmp_path / "two") as (client, rules, clock):
        assert await which(rules) != first
        assert await contents(rules.store) == fresh


@pytest.mark.usefixtures("database")
async def test_a_lab_inside_a_lab_has_a_database_of_its_own(tmp_path):
    (tmp_path / "outer").mkdir()
    (tmp_path / "inner").mkdir()
    async with in_process_lab(tmp_path / "outer") as (outer, outer_rules, _):
        await FakeExporter(outer(), "host-a").beat([device("b0")])
        async with in_process_lab(tmp_path / "inner") as (inner, inner_rules, _):
            assert await which(inner_rules) != await which(outer_rules)
            assert (await inner().get("/devices")).json() == []
            await FakeExporter(inner(), "host-b").beat([device("c0")])
        assert [d["name"] for d in (await outer().get("/devices")).json()] == ["b0"]
