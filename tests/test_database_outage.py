"""A lab whose database goes away for a moment refuses in words, and goes on once it is back:
never a 500, never a connection closed without an answer.

- In process: SQLite's one writer held by another connection past the driver's deadline, a
  disk that refuses SQLite's write (the kernel's file size limit), and a PostgreSQL server
  stopped under a running lab: REST answers 503 ``database_unavailable`` with Retry-After, an
  MCP tool says it in words, the outage is logged once (no traceback), the reaper goes on,
  and the same Idempotency-Key afterwards makes the change once.
- Two coordinator processes under a storm of calls while their PostgreSQL restarts twice
  (``-m fast``, then ``-m immediate``): no 500 and no unanswered call; each change is done
  exactly once or refused in words; both serve normally after.
- The client library waits a restart out for what is safe to repeat (a GET, a keyed call)
  within its timeout, and says the rest in words without sending it again.
- PostgreSQL's connections (``databases``' pool, each task's connection): a connection lost
  at a transaction's BEGIN, COMMIT or ROLLBACK, or under a statement (cut there by a TCP
  relay), a task cancelled in its COMMIT, a COMMIT the server refuses, and restarts of
  PostgreSQL under one task's transactions leave no task on a dead connection and every
  place of the pool free (a pool of one: a place never given back is its last). The URL's
  min_size, max_size and ssl reach the pool and the notification channel.

The PostgreSQL server restarted here is the tests' own (``OwnPostgres``: the shared one of
DEVICE_LOOP_TEST_POSTGRES is not ours to restart).
"""
from __future__ import annotations

import asyncio
import contextlib
import http.client
import inspect
import itertools
import json
import logging
import os
import re
import resource
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
import types
import urllib.parse
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

import lab_in_process
from conftest import Coordinator, coordinator_pair, wait_for
from device_loop.client import http as client_http
from device_loop.client.http import CoordinatorError
from device_loop.coordinator.lifecycle import Settings
from device_loop.coordinator.store import DatabaseUnavailable, Store
from device_loop.coordinator.store.drivers import Listener, SQLite, connect_arguments
from device_loop.coordinator.store.outage import RETRY_AFTER_S, Outage
from device_loop.core.errors import ErrorCode
from device_loop.core.ports import free_port
from lab_in_process import FakeExporter, device, in_process_lab

pytestmark = pytest.mark.timeout(120)

PG_CTL_WAIT_S = 30  # pg_ctl's own wait for a start or a stop (-t), as throwaway-postgres.sh gives it
REAPER_S = 0.05  # the in-process labs' reaper interval: passes to count within a test
CALL_TIMEOUT_S = inspect.signature(client_http.Coordinator).parameters["timeout"].default  # (the client's own)


# ---- a PostgreSQL server of our own ----------------------------------------------------------

def _postgres_bin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name)
                   if p.parent.name.isdigit() else 0)
    if not found:
        if os.environ.get("CI"):
            pytest.fail("CI runs the database outage tests, and PostgreSQL is not installed")
        pytest.skip("PostgreSQL is not installed (sudo apt-get install postgresql)")
    return found[-1]


class OwnPostgres:
    """A PostgreSQL server to stop and restart under a lab, started as throwaway-postgres.sh
    starts one: its own folders and a free port, the postgres account's when we are root;
    ``close()`` stops it and removes its files."""

    def __init__(self, bin_dir: Path):
        self.bin = bin_dir
        self.folder = Path(tempfile.mkdtemp(prefix="device-loop-pg-", dir="/var/tmp"))
        self.folder.chmod(0o755)  # (the postgres account goes through it to its own folders)
        self.owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.data, self.sockets = self.folder / "data", self.folder / "sock"
        for made in (self.data, self.sockets):
            made.mkdir(mode=0o700)
            if self.owner:
                shutil.chown(made, "postgres", "postgres")
        self.port = free_port()
        self.admin_url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.running = False
        self._pg("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C.UTF-8",
                 "--no-sync")
        self.start()

    def _pg(self, tool: str, *args: str) -> None:
        # (from /: the postgres account may not enter the folder we run in)
        done = subprocess.run([*self.owner, str(self.bin / tool), *args], cwd="/", capture_output=True, text=True,
                              timeout=2 * PG_CTL_WAIT_S)
        assert done.returncode == 0, f"{tool} {' '.join(args)}: {done.stdout}{done.stderr}"

    def start(self) -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.data / "server.log"), "-w", "-t", str(PG_CTL_WAIT_S),
                 "-o", f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1 -c fsync=off "
                       "-c max_connections=300", "start")
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        """Stop it: ``fast`` ends every session with 'terminating connection due to
        administrator command'; ``immediate`` kills them (a crash: recovery at the next start)."""
        self.running = False
        self._pg("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", str(PG_CTL_WAIT_S), "stop")

    def restart(self, mode: str) -> None:
        self.stop(mode)
        self.start()

    async def new_database(self) -> str:
        """An empty database of its own (a coordinator migrates it): its URL."""
        name = f"lab_{uuid.uuid4().hex[:12]}"
        admin = await asyncpg.connect(self.admin_url)
        try:
            await admin.execute(f"CREATE DATABASE {name}")
        finally:
            await admin.close()
        return f"{self.admin_url.rsplit('/', 1)[0]}/{name}"

    def close(self) -> None:
        with contextlib.suppress(AssertionError, subprocess.SubprocessError):
            self.stop("immediate")
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture(scope="module")
def own_postgres():
    server = OwnPostgres(_postgres_bin())
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def postgres_server(own_postgres):
    """The module's own PostgreSQL server, running (a test that failed mid-outage left it stopped)."""
    if not own_postgres.running:
        own_postgres.start()
    return own_postgres


# ---- what a refusal looks like -------------------------------------------------------------

def assert_refused_in_words(response, words: str) -> None:
    """A 503 ``database_unavailable`` with Retry-After and a sentence that says ``words``."""
    assert response.status_code == 503, response.text
    assert response.headers.get("Retry-After") == str(RETRY_AFTER_S), response.headers
    answer = response.json()
    assert answer["error"] == ErrorCode.DATABASE_UNAVAILABLE and words in answer["message"], answer
    assert "Idempotency-Key" in answer["message"], "it says how to ask again safely"


async def assert_tool_refuses(app, words: str) -> None:
    """An agent's reserve, through the MCP route: a tool error in words, with the code."""
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), headers={"X-Device-Loop-User": "alice"},
                                  timeout=30) as http, \
            Client(streamable_http_client("http://127.0.0.1/mcp", http_client=http)) as agent:
        said = await agent.call_tool("reserve", {"device": "b0"})
    assert said.is_error and f"[{ErrorCode.DATABASE_UNAVAILABLE}]" in said.content[0].text, said.content
    assert words in said.content[0].text, said.content


def outage_lines(caplog, what: str) -> tuple[list[str], list[str]]:
    """The log's lines of ``what`` going away and coming back."""
    lines = [r.getMessage() for r in caplog.records if r.name.endswith("store.outage")]
    return [x for x in lines if x.startswith(f"{what} is unavailable")], [x for x in lines if f"{what} is back" in x]


async def reaper_passes(rules, more: int) -> None:
    await lab_in_process.reaper_passes(rules, more, REAPER_S)


# ---- in process ----------------------------------------------------------------------------

@pytest.mark.anyio
async def test_a_sqlite_database_locked_too_long_is_a_503_in_words(tmp_path, monkeypatch, caplog):
    # how long a step waits for another process's lock before the database counts as stuck
    # (30 s in a lab); the outage is over at the first call that succeeds
    monkeypatch.setattr(SQLite, "BUSY_DEADLINE_S", 0.2)
    monkeypatch.setattr(Outage, "QUIET_S", 0.0)
    async with in_process_lab(tmp_path, reaper_interval_s=REAPER_S) as (client, rules, clock):
        api = client()
        assert (await FakeExporter(api, "host-a").beat([device("b0")])).status_code == 200
        # another process holds SQLite's one writer (an admin command on the data folder, say)
        holder = sqlite3.connect(rules.store.driver.path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            refused = await api.post("/leases", json={"device": "b0"}, headers={"Idempotency-Key": "k1"})
            assert_refused_in_words(refused, "locked by another process")
            assert (await api.get("/devices")).status_code == 200, "what is committed is still read (WAL)"
            await assert_tool_refuses(client.app, "locked by another process")
            await reaper_passes(rules, 2)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        granted = await api.post("/leases", json={"device": "b0"}, headers={"Idempotency-Key": "k1"})
        assert granted.status_code == 201, granted.text
        again = await api.post("/leases", json={"device": "b0"}, headers={"Idempotency-Key": "k1"})
        assert again.json()["id"] == granted.json()["id"], "the key's change was made once"
        assert len(await rules.store.read("SELECT id FROM leases")) == 1
        await reaper_passes(rules, 2)
    gone, back = outage_lines(caplog, "SQLite")
    assert len(gone) == 1 and "database is locked" in gone[0], gone
    assert len(back) == 1, back
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "no traceback, no error line"


@pytest.mark.anyio
async def test_a_disk_that_fails_sqlite_s_write_is_a_503_in_words(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        assert (await FakeExporter(api, "host-a").beat([device("b0")])).status_code == 200
        with contextlib.closing(sqlite3.connect(rules.store.driver.path)) as other:
            other.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # (the next commit's pages extend the log)
        # the kernel refuses to extend any file of this process: a failing (or full) disk, as SQLite sees it
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
        try:
            refused = await api.post("/leases", json={"device": "b0"}, headers={"Idempotency-Key": "k1"})
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        assert_refused_in_words(refused, "cannot be read or written (its disk failed, or is full)")
        granted = await api.post("/leases", json={"device": "b0"}, headers={"Idempotency-Key": "k1"})
        assert granted.status_code == 201, granted.text
        assert len(await rules.store.read("SELECT id FROM leases")) == 1


# ---- PostgreSQL's connections: each task's, let go of whatever a step met -----------------------

def test_the_notification_channel_reaches_postgresql_as_databases_pool_does():
    """(``databases`` reads the pool's min_size, max_size and ssl from the URL's query, and
    nothing else of it; the channel's own connection takes its ssl)"""
    assert connect_arguments("postgresql+asyncpg://u:p%40ss@db.example:5433/lab?min_size=2&max_size=20&ssl=false"
                             "&sslmode=disable") == \
        {"host": "db.example", "port": 5433, "user": "u", "password": "p@ss", "database": "lab", "ssl": False}
    assert connect_arguments("postgres://localhost/lab?ssl=Verify-Full")["ssl"] == "verify-full"
    assert "ssl" not in connect_arguments("postgres://localhost/lab")


@pytest.mark.anyio
async def test_the_url_s_options_reach_the_pool_and_the_notification_channel(postgres_database):
    # ssl: this server has none, so asking for it is refused, to the pool and to the channel alike
    with pytest.raises(ConnectionError, match="SSL"):
        await Store(f"{postgres_database}?ssl=true").connect()
    with pytest.raises(ConnectionError, match="SSL"):
        await Listener(f"{postgres_database}?ssl=true", lambda keys: None).open()

    store = Store(f"{postgres_database}?min_size=1&max_size=1&ssl=false")
    await store.connect()  # (the channel too: asyncpg would have sent min_size to the server as a setting)
    try:
        heard = asyncio.Event()
        store.subscribe(lambda keys: heard.set() if keys and "k" in keys else None)
        async with store.tx():
            store.changed("k")
            await store.run("SELECT 1")
        await asyncio.wait_for(heard.wait(), CALL_TIMEOUT_S)
        # four statements at once take turns on the pool's one connection (it opened one: min_size)
        counts = await asyncio.gather(*(store.rows(
            "SELECT count(*) AS n, pg_sleep(0.05) FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()") for _ in range(4)))
        assert [c[0]["n"] for c in counts] == [1] * 4, "the pool's connection and the channel's, and none else"
    finally:
        await asyncio.wait_for(store.disconnect(), CALL_TIMEOUT_S)  # (a place never given back: it waits)


class Relay:
    """A TCP relay on loopback to a PostgreSQL server, which cuts a connection at the step a
    test chooses: after ``cut()``, the next connection to send anything is closed, both ways,
    before what it sent goes on (a server that died, or a network that failed, right then);
    after ``stall()`` it is kept unanswered instead, until its client closes it."""

    def __init__(self, url: str):
        self.upstream = urllib.parse.urlsplit(url)
        self.armed: str | None = None
        self.stalled = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> str:
        """Start relaying: the URL that goes through the relay."""
        self.server = await asyncio.start_server(self._link, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        netloc = self.upstream.netloc.rsplit("@", 1)[0] + f"@127.0.0.1:{port}"
        return self.upstream._replace(netloc=netloc).geturl()

    def cut(self) -> None:
        self.armed = "cut"

    def stall(self) -> None:
        self.armed = "stall"

    async def _link(self, client: asyncio.StreamReader, to_client: asyncio.StreamWriter) -> None:
        server, to_server = await asyncio.open_connection(self.upstream.hostname, self.upstream.port)
        self.writers |= {to_client, to_server}
        try:
            await asyncio.gather(self._pump(client, to_server, upward=True), self._pump(server, to_client))
        finally:
            for writer in (to_client, to_server):
                writer.close()
                self.writers.discard(writer)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upward: bool = False) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if upward and self.armed:
                    armed, self.armed = self.armed, None
                    if armed == "stall":
                        self.stalled.set()
                        while await reader.read(65536):
                            pass  # (unanswered until the client hangs up)
                    break
                writer.write(data)
                await writer.drain()
        writer.close()  # (one way ends: both do)

    async def close(self) -> None:
        for writer in list(self.writers):
            writer.close()
        if self.server:
            self.server.close()


class Abandoned(Exception):
    """A transaction's body gave up: its ROLLBACK follows."""


async def one_connection_through(relay: Relay) -> Store:
    """A store on the relay's server and database, through it, its pool of one connection (``databases`` reads
    min_size and max_size from the URL): a place in it that was never given back is its last."""
    store = Store(f"{await relay.start()}?min_size=1&max_size=1")
    await store.connect()
    await store.run("CREATE TABLE probe (k INTEGER)")
    return store


async def lose_the_connection_at(step: str, store: Store, relay: Relay) -> None:
    """Start a transaction (or, ``statement``, a query outside one) whose connection is lost
    at ``step``, as a restart of PostgreSQL loses it."""
    if step == "statement":
        relay.cut()
        await store.rows("SELECT k FROM probe")
        return
    if step == "begin":
        relay.cut()
    async with store.tx():
        await store.run("INSERT INTO probe (k) VALUES (1)")
        if step in ("commit", "rollback"):
            relay.cut()
        if step == "rollback":
            raise Abandoned()


@pytest.mark.anyio
@pytest.mark.parametrize("step", ["begin", "commit", "rollback", "statement"])
async def test_a_connection_lost_at_any_step_leaves_no_task_on_it(postgres_database, step):
    relay = Relay(postgres_database)
    store = await one_connection_through(relay)
    try:
        with pytest.raises(Abandoned if step == "rollback" else DatabaseUnavailable):
            await lose_the_connection_at(step, store, relay)
        # the same task goes on, on a live connection (databases kept one a task)...
        async with store.tx():
            await store.run("INSERT INTO probe (k) VALUES (2)")
        assert await store.rows("SELECT k FROM probe") == [{"k": 2}], "the lost transaction was not committed"
        # ...and another task has the pool's one place
        other = asyncio.create_task(store.rows("SELECT count(*) AS n FROM probe"))
        assert await asyncio.wait_for(other, CALL_TIMEOUT_S) == [{"n": 1}]
    finally:
        await asyncio.wait_for(store.disconnect(), CALL_TIMEOUT_S)  # (a place never given back: it waits)
        await relay.close()


@pytest.mark.anyio
async def test_a_task_cancelled_in_its_commit_gives_the_pool_its_place_back(postgres_database):
    relay = Relay(postgres_database)
    store = await one_connection_through(relay)
    try:
        async def commits() -> None:
            async with store.tx():
                await store.run("INSERT INTO probe (k) VALUES (1)")
                relay.stall()  # its COMMIT goes unanswered
        committing = asyncio.create_task(commits())
        await asyncio.wait_for(relay.stalled.wait(), CALL_TIMEOUT_S)
        committing.cancel()  # (a caller hung up, the coordinator stops)
        with pytest.raises(asyncio.CancelledError):
            await committing
        other = asyncio.create_task(store.rows("SELECT count(*) AS n FROM probe"))
        assert await asyncio.wait_for(other, CALL_TIMEOUT_S) == [{"n": 0}]
    finally:
        await asyncio.wait_for(store.disconnect(), CALL_TIMEOUT_S)  # (a place never given back: it waits)
        await relay.close()


@pytest.mark.anyio
async def test_a_commit_the_server_refuses_keeps_its_connection_and_frees_its_place(postgres_database):
    store = Store(f"{postgres_database}?min_size=1&max_size=1")
    await store.connect()
    try:
        await store.run("CREATE TABLE probe (k INTEGER UNIQUE DEFERRABLE INITIALLY DEFERRED)")
        backend = await store.rows("SELECT pg_backend_pid() AS pid")
        with pytest.raises(asyncpg.UniqueViolationError):  # (checked at the COMMIT)
            async with store.tx():
                await store.run("INSERT INTO probe (k) VALUES (1), (1)")
        other = asyncio.create_task(store.rows("SELECT pg_backend_pid() AS pid"))
        assert await asyncio.wait_for(other, CALL_TIMEOUT_S) == backend, \
            "the server ended the transaction itself: its connection serves on"
        assert await store.rows("SELECT k FROM probe") == []
    finally:
        await asyncio.wait_for(store.disconnect(), CALL_TIMEOUT_S)  # (a place never given back: it waits)


@pytest.mark.service
@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_a_task_s_transactions_go_on_after_a_restart_of_postgresql(postgres_server, mode):
    store = Store(f"{await postgres_server.new_database()}?min_size=1&max_size=2")
    await store.connect()
    try:
        await store.run("CREATE TABLE probe (k INTEGER)")
        committed, causes, stop = [0], [], asyncio.Event()

        async def one_task() -> None:  # (as the reaper is: one task, pass after pass)
            while not stop.is_set():
                try:
                    async with store.tx():
                        await store.run("INSERT INTO probe (k) VALUES (:k)", k=committed[0])
                        await store.rows("SELECT count(*) FROM probe")
                    committed[0] += 1
                except DatabaseUnavailable as exc:
                    causes.append(repr(exc.__cause__))
                    await asyncio.sleep(REAPER_S)  # (its next pass)

        async def committed_more(than: int) -> None:
            while committed[0] < than + 20:
                assert not transacting.done(), transacting.exception()
                await asyncio.sleep(REAPER_S)

        transacting = asyncio.create_task(one_task())
        try:
            await asyncio.wait_for(committed_more(0), CALL_TIMEOUT_S)
            await asyncio.to_thread(postgres_server.restart, mode)
            await asyncio.wait_for(committed_more(committed[0]), CALL_TIMEOUT_S)
        finally:
            stop.set()
            await transacting
        assert causes, "the restart met no transaction: it tested nothing"
        assert not [c for c in causes if "another operation is in progress" in c], causes
        # every place in the pool is free: two tasks at once each have one
        both = asyncio.gather(*(store.rows("SELECT pg_backend_pid() AS pid, pg_sleep(0.05)") for _ in range(2)))
        assert len({r[0]["pid"] for r in await asyncio.wait_for(both, CALL_TIMEOUT_S)}) == 2
    finally:
        await asyncio.wait_for(store.disconnect(), CALL_TIMEOUT_S)  # (a place never given back: it waits)


@pytest.mark.service
@pytest.mark.anyio
async def test_a_stopped_postgresql_is_a_503_in_words_and_the_lab_goes_on(postgres_server, tmp_path, monkeypatch,
                                                                          caplog):
    monkeypatch.setattr(Outage, "QUIET_S", 0.0)
    url = await postgres_server.new_database()
    settings = {"reaper_interval_s": REAPER_S, "image_dir": str(tmp_path / "images")}
    async with lab_in_process._lab(url, True, None, (), settings) as (client, rules, clock):
        api = client()
        assert (await FakeExporter(api, "host-a").beat([device("b0")])).status_code == 200
        await asyncio.to_thread(postgres_server.stop, "fast")
        try:
            assert_refused_in_words(await api.get("/devices"), "lost its connection to the lab's database")
            refused = await api.post("/leases", json={"device": "b0"}, headers={"Idempotency-Key": "k1"})
            assert_refused_in_words(refused, "lost its connection to the lab's database")
            assert_refused_in_words(await api.get("/leases"), "lost its connection to the lab's database")
            await assert_tool_refuses(client.app, "lost its connection to the lab's database")
            await reaper_passes(rules, 2)  # (each refused)
        finally:
            await asyncio.to_thread(postgres_server.start)
        assert (await api.get("/devices")).status_code == 200, "the pool connects afresh"
        granted = await api.post("/leases", json={"device": "b0"}, headers={"Idempotency-Key": "k1"})
        assert granted.status_code == 201, granted.text
        again = await api.post("/leases", json={"device": "b0"}, headers={"Idempotency-Key": "k1"})
        assert again.json()["id"] == granted.json()["id"], "the key's change was made once"
        assert len(await rules.store.read("SELECT id FROM leases")) == 1
        passes = rules.reap_passes
        await reaper_passes(rules, 2)
        assert rules.reap_passes > passes
    gone, back = outage_lines(caplog, "PostgreSQL")
    assert len(gone) == 1, gone
    assert len(back) == 1, back
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "no traceback, no error line"


# ---- two coordinator processes, a storm, PostgreSQL restarted under it --------------------------

STORM_THREADS = 6  # three a coordinator process
RESTARTS = ("fast", "immediate")
STORM_DEVICES = 8
STORM_TTL_S = 600
BEAT_S = 0.2  # the storm's exporter reports this often


@dataclass
class Sent:
    """One call of the storm, and what came of it."""
    via: int
    op: str
    method: str
    path: str
    body: dict | None
    key: str | None
    user: str
    seq: int = 0  # its place among every call's ends
    status: int | None = None
    answer: Any = None  # its JSON
    retry_after: str | None = None
    unanswered: str | None = None  # why, if no answer came


def exchange(connection: http.client.HTTPConnection, sent: Sent) -> None:
    headers = {"X-Device-Loop-User": sent.user} | ({"Idempotency-Key": sent.key} if sent.key else {})
    body = None
    if sent.body is not None:
        body, headers["Content-Type"] = json.dumps(sent.body).encode(), "application/json"
    connection.request(sent.method, f"/api/v1{sent.path}", body=body, headers=headers)
    response = connection.getresponse()
    sent.status, sent.answer = response.status, json.loads(response.read())
    sent.retry_after = response.getheader("Retry-After")


def storm(n: int, coordinator, stop: threading.Event, record: list[Sent], ends) -> None:
    """One client of the storm: reserve a device, then read it, renew it, list the board and
    release it, over and over; each change with an Idempotency-Key of its own."""
    user, lease = f"storm-{n}", None
    connection = http.client.HTTPConnection("127.0.0.1", coordinator.port, timeout=CALL_TIMEOUT_S)
    for turn in itertools.count():
        if stop.is_set():
            break
        key = uuid.uuid4().hex
        if lease is None:
            sent = Sent(n % 2, "reserve", "POST", "/leases", {"class": "sim-board", "ttl_s": STORM_TTL_S}, key, user)
        else:
            sent = [Sent(n % 2, "status", "GET", f"/leases/{lease}", None, None, user),
                    Sent(n % 2, "renew", "POST", f"/leases/{lease}/renew", {"ttl_s": STORM_TTL_S}, key, user),
                    Sent(n % 2, "list", "GET", "/devices", None, None, user),
                    Sent(n % 2, "release", "POST", f"/leases/{lease}/release", {}, key, user)][turn % 4]
        try:
            exchange(connection, sent)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            sent.unanswered = repr(exc)
            connection.close()
            connection = http.client.HTTPConnection("127.0.0.1", coordinator.port, timeout=CALL_TIMEOUT_S)
        sent.seq = next(ends)
        record.append(sent)
        if sent.op == "reserve" and sent.status == 201:
            lease = sent.answer["id"]
        elif sent.op == "release" and sent.status == 200 or sent.status == 409 and sent.op != "reserve":
            lease = None  # (ended: released, or refused as ended)
    connection.close()


def beats(coordinators, stop: threading.Event, record: list[Sent], ends) -> None:
    """The host's exporter through the storm, through each process in turn: its reports give
    back the devices the storm released (reclaimed: no service runs for their leases)."""
    exporter = FakeExporter(None, "host-a")
    connections = [http.client.HTTPConnection("127.0.0.1", c.port, timeout=CALL_TIMEOUT_S) for c in coordinators]
    for turn in itertools.count():
        via = turn % 2
        report = exporter.report([device(f"b{i}") for i in range(STORM_DEVICES)], heartbeat_s=BEAT_S)
        sent = Sent(via, "heartbeat", "POST", "/hosts/host-a/heartbeat", report, None, "host-a")
        try:
            exchange(connections[via], sent)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            sent.unanswered = repr(exc)
            connections[via].close()
        sent.seq = next(ends)
        record.append(sent)
        if stop.wait(BEAT_S):
            break
    for connection in connections:
        connection.close()


def cycled_since(record: list[Sent], seq: int) -> bool:
    """Every client of the storm gave a lease back since call ``seq``: a whole round of its calls."""
    return len({s.user for s in list(record) if s.seq > seq and s.op == "release" and s.status == 200}) == STORM_THREADS


def settled(coordinator, sent: Sent) -> Sent:
    """``sent`` asked again, with its key, until it is not refused for the outage: its answer."""
    again = Sent(sent.via, sent.op, sent.method, sent.path, sent.body, sent.key, sent.user)

    def answered() -> bool:
        connection = http.client.HTTPConnection("127.0.0.1", coordinator.port, timeout=CALL_TIMEOUT_S)
        try:
            exchange(connection, again)
        finally:
            connection.close()
        return again.status != 503
    wait_for(answered, CALL_TIMEOUT_S, what=f"{sent.op} {sent.path} answered")
    return again


@pytest.mark.service
def test_a_storm_through_two_restarts_of_postgresql(postgres_server, tmp_path, env):
    url = asyncio.run(postgres_server.new_database())
    with coordinator_pair(tmp_path, env, url) as coordinators:
        record: list[Sent] = []
        stop, ends = threading.Event(), itertools.count(1)
        threads = [threading.Thread(target=beats, args=(coordinators, stop, record, ends), daemon=True)]
        threads += [threading.Thread(target=storm, args=(n, coordinators[n % 2], stop, record, ends), daemon=True)
                    for n in range(STORM_THREADS)]
        threads[0].start()
        wait_for(lambda: any(s.status == 200 for s in list(record)), CALL_TIMEOUT_S, what="the host's first report")
        for thread in threads[1:]:
            thread.start()
        try:
            wait_for(lambda: cycled_since(record, 0), CALL_TIMEOUT_S, what="a round of the storm")
            for mode in RESTARTS:
                postgres_server.restart(mode)
                restarted = max(s.seq for s in list(record))
                wait_for(lambda since=restarted: cycled_since(record, since), CALL_TIMEOUT_S,
                         what=f"a round of the storm after the {mode} restart")
        finally:
            stop.set()
            for thread in threads:
                thread.join(2 * CALL_TIMEOUT_S)
        assert not any(thread.is_alive() for thread in threads), "a call of the storm never came back"

        unanswered = [s for s in record if s.unanswered]
        assert not unanswered, f"connections closed without an answer: {unanswered[:5]}"
        failed = [s for s in record if s.status is not None and s.status >= 500 and s.status != 503]
        assert not failed, f"{len(failed)} answers like {failed[0].status} {failed[0].answer}" if failed else ""
        refused = [s for s in record if s.status == 503]
        assert refused, "no call met the outage: the storm tested nothing"
        assert all(s.retry_after == str(RETRY_AFTER_S) and s.answer["error"] == ErrorCode.DATABASE_UNAVAILABLE
                   and s.answer["message"] for s in refused), refused[0]
        assert all(s.answer.get("error") and s.answer.get("message") for s in record if s.status >= 400), \
            "every refusal says why, in words"

        # every change refused for the outage, asked again with its key: done once, or refused in words
        changes = [s for s in record if s.key and s.status == 503]
        outcomes = [settled(coordinators[s.via], s) for s in changes]
        assert all(o.status < 300 or o.answer.get("message") for o in outcomes), outcomes
        granted = {s.answer["id"] for s in [*record, *outcomes] if s.op == "reserve" and s.status == 201}
        held = {r["id"] for r in asyncio.run(_rows(url, "SELECT id FROM leases WHERE holder LIKE 'storm-%'"))}
        assert held == granted, f"leases nobody was told of: {held - granted}; told of but never made: " \
                                f"{granted - held}"
        twice = asyncio.run(_rows(url, "SELECT lease_id FROM audit WHERE action = 'release' GROUP BY lease_id "
                                       "HAVING count(*) > 1"))
        assert not twice, twice

        # both serve as before: the board, a lease made and given back, the reaper, the logs
        for lease_id in held:
            holder = next(s.user for s in [*record, *outcomes] if s.op == "reserve" and s.answer.get("id") == lease_id)
            client_http.Coordinator(coordinators[0].url, holder).post(f"/leases/{lease_id}/release")
        beat = httpx2.post(f"{coordinators[1].url}/api/v1/hosts/host-a/heartbeat", timeout=CALL_TIMEOUT_S,
                           json=FakeExporter(None, "host-a").report([device(f"b{i}") for i in range(STORM_DEVICES)]))
        assert beat.status_code == 200, beat.text
        for via, coordinator in enumerate(coordinators):
            api = client_http.Coordinator(coordinator.url, f"after-{via}")
            assert len(api.get("/devices")) == STORM_DEVICES
            lease = api.post("/leases", {"class": "sim-board", "ttl_s": 1})
            assert api.post(f"/leases/{lease['id']}/release")["state"] == "released"
        short = client_http.Coordinator(coordinators[1].url, "short").post("/leases", {"class": "sim-board",
                                                                                      "ttl_s": 1})
        reaper_s = Settings().reaper_interval_s
        wait_for(lambda: coordinators[0].api(f"/leases/{short['id']}", headers={"X-Device-Loop-User": "short"}
                                             ).json()["state"] == "expired",
                 1 + 20 * reaper_s, what="the reapers expiring a lease after the restarts")
        for coordinator in coordinators:
            log = coordinator.output()
            assert "Exception in ASGI application" not in log and " ERROR " not in log, log[-5000:]
            assert "another operation is in progress" not in log, "two tasks shared a connection"
            gone = re.findall(r"PostgreSQL is unavailable", log)
            assert 1 <= len(gone) <= len(RESTARTS), f"the outage is told once, not a call: {len(gone)} times"


async def _rows(url: str, sql: str, *args: Any) -> list[dict]:
    """The rows of a query, read straight from the lab's PostgreSQL database."""
    connection = await asyncpg.connect(url)
    try:
        return [dict(r) for r in await connection.fetch(sql, *args)]
    finally:
        await connection.close()


# ---- the client library ------------------------------------------------------------------------

class HangsUp:
    """A TCP peer that reads each request's head and closes the connection without an
    answer, as a coordinator does that restarts mid-call; it notes each request's
    Idempotency-Key (None: it had none)."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.keys: list[str | None] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                connection, _ = self.server.accept()
                with connection:
                    head = b""
                    while b"\r\n\r\n" not in head and (chunk := connection.recv(65536)):
                        head += chunk
                    if head:
                        key = re.search(rb"(?im)^Idempotency-Key: *(\S+)", head)
                        self.keys.append(key[1].decode() if key else None)

    def close(self) -> None:
        self.server.close()


def test_an_unanswered_call_is_sent_again_only_if_that_is_safe():
    peer = HangsUp()
    try:
        api = client_http.Coordinator(peer.url, "alice", retries=3)
        with pytest.raises(CoordinatorError) as unkeyed:
            api._request("POST", "/leases/L-1/renew", body=b"{}", headers={"Content-Type": "application/json"})
        assert unkeyed.value.code == ErrorCode.UNREACHABLE and unkeyed.value.status == 0
        assert "may or may not have been carried out" in unkeyed.value.message, unkeyed.value.message
        assert peer.keys == [None], "a call that is not safe to repeat was sent once"
        with pytest.raises(CoordinatorError) as read:
            api.get("/devices")
        assert read.value.code == ErrorCode.UNREACHABLE and peer.keys == [None] * 4, "a GET was asked again"
        with pytest.raises(CoordinatorError):
            api.post("/leases", {"device": "b0"})
        keyed = peer.keys[4:]
        assert len(keyed) == 3 and keyed[0] and len(set(keyed)) == 1, "a keyed call was asked again with its key"
    finally:
        peer.close()


class Waits:
    """The client's clock, watched: which thread waited how long (each wait is made)."""

    def __init__(self):
        self.waited: list[tuple[str, float]] = []
        self.monotonic = time.monotonic

    def sleep(self, seconds: float) -> None:
        self.waited.append((threading.current_thread().name, seconds))
        time.sleep(seconds)


@pytest.mark.service
def test_the_client_waits_a_database_restart_out_for_what_is_safe_to_repeat(postgres_server, tmp_path, env,
                                                                            monkeypatch):
    waits = Waits()
    monkeypatch.setattr(client_http, "time", types.SimpleNamespace(monotonic=waits.monotonic, sleep=waits.sleep))
    url = asyncio.run(postgres_server.new_database())
    coordinator = Coordinator(tmp_path, env, extra=("--single-user", "--database-url", url))
    try:
        api = client_http.Coordinator(coordinator.url, "alice")
        api.post("/hosts/host-a/heartbeat", FakeExporter(None, "host-a").report([device("b0")]), keyed=False)
        lease = api.post("/leases", {"device": "b0", "ttl_s": 600})
        postgres_server.stop("fast")
        try:
            with pytest.raises(CoordinatorError) as unkeyed:  # (no caller of the library sends one: a future one)
                api._request("POST", f"/leases/{lease['id']}/renew", body=b'{"ttl_s": 900}',
                             headers={"Content-Type": "application/json"})
            assert (unkeyed.value.status, unkeyed.value.code) == (503, ErrorCode.DATABASE_UNAVAILABLE)
            assert "lost its connection to the lab's database" in unkeyed.value.message
            assert not waits.waited, "a call that is not safe to repeat is not asked again"
            with ThreadPoolExecutor(2, thread_name_prefix="client") as pool:
                read = pool.submit(api.get, f"/leases/{lease['id']}")
                renewed = pool.submit(api.post, f"/leases/{lease['id']}/renew", {"ttl_s": 1200})
                wait_for(lambda: len({name for name, _ in waits.waited}) == 2, CALL_TIMEOUT_S,
                         what="the read and the renewal refused, and waiting")
                postgres_server.start()
                assert read.result(CALL_TIMEOUT_S)["id"] == lease["id"]
                assert renewed.result(CALL_TIMEOUT_S)["ends_at"] > lease["ends_at"]
        finally:
            if not postgres_server.running:
                postgres_server.start()
        assert {seconds for _, seconds in waits.waited} == {RETRY_AFTER_S}, "each wait was the one asked for"
        renewals = asyncio.run(_rows(url, "SELECT id FROM audit WHERE action = 'renew' AND lease_id = $1", lease["id"]))
        assert len(renewals) == 1, "the renewal was made once"
    finally:
        coordinator.stop()
