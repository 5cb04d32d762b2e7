"""A long-poll is answered as soon as what it watches changes, whichever coordinator
process made the change (PostgreSQL's LISTEN/NOTIFY), and still after that channel broke."""
import asyncio
import time

import asyncpg
import httpx2
import pytest

import conftest
from lab_in_process import FakeExporter, device

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

WAIT_S = 20.0  # the long-poll's own limit: an answer well before it was woken
# The last read of a desired state (Hosts.desired: the host's queued operations), finished:
# a long-poll that did it after $1 read the state then and waits for the next change (it
# took its wake-up before reading), so what is changed after this shows only if it is woken.
READ_DONE = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle' "
             "AND query_start >= $1 AND query LIKE 'SELECT * FROM operations WHERE host = % ORDER BY created_at'")


async def parked(admin: asyncpg.Connection, since, poll: asyncio.Task) -> None:
    """Wait until the long-poll ``poll``, sent after ``since`` (the server's clock), read the
    desired state and waits."""
    deadline = time.monotonic() + conftest.WAIT_S
    while not await admin.fetchval(READ_DONE, since):
        assert not poll.done(), f"the long-poll answered before anything changed: {poll.result().text}"
        assert time.monotonic() < deadline, "the long-poll did not read the desired state"
        await asyncio.sleep(0.01)


async def reserve_and_watch(admin: asyncpg.Connection, watcher: httpx2.AsyncClient, changer: httpx2.AsyncClient,
                            name: str) -> float:
    """Reserve ``name`` through ``changer`` while ``watcher`` long-polls host-a's desired
    state; the seconds the long-poll took, once it shows the new lease."""
    etag = (await watcher.get("/hosts/host-a/desired")).json()["etag"]
    since = await admin.fetchval("SELECT clock_timestamp()")
    started = time.monotonic()
    poll = asyncio.create_task(watcher.get("/hosts/host-a/desired", params={"etag": etag, "wait": WAIT_S}))
    await parked(admin, since, poll)
    lease = (await changer.post("/leases", json={"device": name}, headers={"X-Device-Loop-User": "alice"})).json()
    answer = (await poll).json()
    assert lease["id"] in [s["lease"] for s in answer["services"]], answer
    return time.monotonic() - started


async def test_a_long_poll_wakes_at_a_change_made_by_another_process(two_coordinators, postgres_database):
    first, second = two_coordinators
    async with httpx2.AsyncClient(base_url=f"{first.url}/api/v1", timeout=60) as one, \
            httpx2.AsyncClient(base_url=f"{second.url}/api/v1", timeout=60) as two:
        assert (await FakeExporter(one, "host-a").beat([device(f"b{i}") for i in range(3)])).status_code == 200
        admin = await asyncpg.connect(postgres_database)
        try:
            assert await reserve_and_watch(admin, two, one, "b0") < WAIT_S / 2

            # the channel breaks (a restarted or failed-over server): long-polls still wake, and
            # each process listens again
            listening = ("SELECT {} FROM pg_stat_activity WHERE datname = current_database() "
                         "AND (query LIKE 'LISTEN%' OR query = 'SELECT 1')")  # (the channel's own check)
            assert await admin.fetchval(listening.format("count(pg_terminate_backend(pid))")) == 2, \
                "each coordinator process listens on a connection of its own"
            assert await reserve_and_watch(admin, two, one, "b1") < WAIT_S / 2
            deadline = time.monotonic() + conftest.WAIT_S
            while await admin.fetchval(listening.format("count(*)")) < 2:
                assert time.monotonic() < deadline, "a process did not listen again"
                await asyncio.sleep(0.2)  # (polling the condition)

            assert await reserve_and_watch(admin, one, two, "b2") < WAIT_S / 2
        finally:
            await admin.close()
