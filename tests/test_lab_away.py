"""A lab that was away holds its absence against no client (docs/architecture.md, "A lab that
was away"): a coordinator restarted, or its database gone for a while, counts keepalive leases'
and tickets' lapses from when it serves again; a client that died meanwhile still loses its
lease a keepalive later. In process for the rules; through processes for a kill -9 of the
coordinator under a keepalive ``with`` and a keepalive ticket, on SQLite and on PostgreSQL."""
from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from conftest import SQLITE_ONLY, Coordinator, Exporter, sim_devices, wait_for
from device_loop.coordinator.store.drivers import SQLite
from device_loop.coordinator.store.outage import Outage
from device_loop.core.durations import parse_iso
import lab_in_process
from lab_in_process import FakeExporter, device, in_process_lab

pytestmark = pytest.mark.timeout(120)

KEEPALIVE_S = 10
REAPER_S = 0.05  # the in-process lab's reaper interval: passes to count within a test


async def reaper_passes(rules, more: int) -> None:
    await lab_in_process.reaper_passes(rules, more, REAPER_S)


async def kept(api) -> tuple[dict, dict]:
    """b0 leased with a keepalive by alice (its service up), and bob's keepalive ticket waiting
    for it."""
    exporter = FakeExporter(api, "host-a")
    await exporter.beat([device("b0")])
    lease = (await api.post("/leases", json={"device": "b0", "keepalive_s": KEEPALIVE_S})).json()
    await exporter.serve(lease)
    ticket = (await api.post("/leases", json={"device": "b0", "queue": True, "keepalive_s": KEEPALIVE_S},
                             headers={"X-Device-Loop-User": "bob"})).json()
    assert ticket["state"] == "waiting", ticket
    return lease, ticket


async def states(api, lease: dict, ticket: dict) -> tuple[str, str, float]:
    """(the lease's state, the ticket's, when the lease lapses)."""
    now_lease = (await api.get(f"/leases/{lease['id']}")).json()
    now_ticket = (await api.get(f"/tickets/{ticket['ticket']}", headers={"X-Device-Loop-User": "bob"})).json()
    return now_lease["state"], now_ticket["state"], parse_iso(now_lease["expires_at"])


DATABASES = SQLITE_ONLY  # (the rules' SQL is one statement each, the same on both; the processes' test runs both)


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_the_lab_back_from_away_counts_keepalives_from_then_and_a_dead_client_still_loses(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        lease, ticket = await kept(api)
        clock.advance(KEEPALIVE_S + 5)  # the lab was away: nobody could renew or ask
        await rules.back()  # (a restarted process's first pass)
        await rules.reap()
        lease_state, ticket_state, lapse = await states(api, lease, ticket)
        assert (lease_state, ticket_state) == ("active", "waiting"), "its absence held against them"
        assert lapse == pytest.approx(clock() + KEEPALIVE_S)
        assert rules.serving_since == clock()
        clock.advance(KEEPALIVE_S + 1)  # nobody came back: the clients died meanwhile
        await rules.reap()
        lease_state, ticket_state, _ = await states(api, lease, ticket)
        assert (lease_state, ticket_state) == ("expired", "expired")


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_a_database_that_was_away_holds_that_against_no_keepalive(tmp_path, monkeypatch):
    monkeypatch.setattr(SQLite, "BUSY_DEADLINE_S", 0.2)
    monkeypatch.setattr(Outage, "QUIET_S", 0.0)
    async with in_process_lab(tmp_path, reaper_interval_s=REAPER_S) as (client, rules, clock):
        api = client()
        lease, ticket = await kept(api)
        # another process holds SQLite's one writer past its deadline: the reaper's passes fail
        holder = sqlite3.connect(rules.store.driver.path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            await reaper_passes(rules, 2)
            clock.advance(KEEPALIVE_S + 5)  # no renewal could be made meanwhile (503)
            refused = await api.post(f"/leases/{lease['id']}/renew", json={})
            assert refused.status_code == 503
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        await reaper_passes(rules, 2)
        lease_state, ticket_state, lapse = await states(api, lease, ticket)
        assert (lease_state, ticket_state) == ("active", "waiting"), "the database's absence held against them"
        assert lapse == pytest.approx(clock() + KEEPALIVE_S)
        clock.advance(KEEPALIVE_S + 1)
        await reaper_passes(rules, 2)
        assert (await states(api, lease, ticket))[:2] == ("expired", "expired")


# ---- through processes: kill -9 of the coordinator ------------------------------------------

OUTAGE_S = 7.0  # the coordinator is down longer than a keepalive (5 s), shorter than a CI job's patience
PROCESS_KEEPALIVE_S = 5


@pytest.fixture(params=["sqlite", "postgresql"])
def coordinator_extra(request) -> tuple[str, ...]:
    if request.param == "sqlite":
        return ("--single-user",)
    return ("--single-user", "--database-url", request.getfixturevalue("postgres_database"))


def _device_loop(env: dict, *args: str) -> subprocess.Popen:
    """``device-loop ARGS``: its output (both streams) in a pipe, its input a pipe kept open
    (``reserve --keepalive`` holds its lease until its input ends)."""
    return subprocess.Popen([sys.executable, "-m", "device_loop.cli", *args], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def read_until(stream, text: str) -> str:
    """What ``stream`` said up to and with the line that begins with ``text``."""
    seen = ""
    for line in iter(stream.readline, ""):
        seen += line
        if line.startswith(text):
            return seen
    raise AssertionError(f"it ended before it said {text!r}:\n{seen}")


@pytest.mark.service
def test_a_coordinator_killed_and_back_fails_neither_a_with_nor_a_ticket(tmp_path, env, coordinator_extra):
    coordinator = Coordinator(tmp_path, env, coordinator_extra)
    exporter = Exporter(tmp_path, env, coordinator.url, sim_devices("sim-board-0"))
    env = {**env, "DEVICE_LOOP_COORDINATOR": coordinator.url}
    go_on = tmp_path / "go-on"
    running, queued = None, None

    def bobs_tickets() -> list[str]:
        return [t["state"] for t in coordinator.api("/tickets", headers={"X-Device-Loop-User": "bob"}).json()]
    try:
        wait_for(lambda: coordinator.api("/devices/sim-board-0").json().get("state") == "idle", what="the board idle")
        running = _device_loop(env, "with", "sim-board-0", "--keepalive", f"{PROCESS_KEEPALIVE_S}s", "--", "sh", "-c",
                               f"echo started; while [ ! -e {go_on} ]; do sleep 0.1; done; exit 3")
        assert running.stdout is not None
        read_until(running.stdout, "started")
        queued = _device_loop({**env, "DEVICE_LOOP_USER": "bob"}, "reserve", "sim-board-0", "--queue", "--keepalive",
                              f"{PROCESS_KEEPALIVE_S}s")
        wait_for(lambda: bobs_tickets() == ["waiting"], what="bob's keepalive ticket waiting")

        coordinator.stop(signal.SIGKILL)
        time.sleep(OUTAGE_S)  # (the outage itself, the condition under test: no synchronisation)
        coordinator.start()
        coordinator.wait_ready()
        go_on.touch()
        assert running.wait(60) == 3, f"the command's own status, not a lab failure:\n{running.stdout.read()}"
        # the with released the board: the ticket, kept through the outage, gets it
        assert queued.stdout is not None
        held = read_until(queued.stdout, "lease-")  # (printed once the lease is ready, then held)
        assert "on sim-board-0: active" in held and bobs_tickets() == ["claimed"], held
        queued.send_signal(signal.SIGTERM)
        said = queued.communicate(timeout=60)[0]
        assert queued.returncode == 0 and "lab failure" not in said, said
    finally:
        for process in (running, queued):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(10)
        exporter.stop()
        coordinator.stop()
