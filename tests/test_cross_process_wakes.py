"""A long-poll is answered as soon as what it watches changes, whichever coordinator
process made the change (PostgreSQL's LISTEN/NOTIFY), and still after that channel broke."""
import asyncio
import time

import asyncpg
import httpx2
import pytest

from lab_in_process import FakeExporter, device

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

WAIT_S = 20.0  # the long-poll's own limit: an answer well before it was woken


async def reserve_and_watch(watcher: httpx2.AsyncClient, changer: httpx2.AsyncClient, name: str) -> float:
    """Reserve ``name`` through ``changer`` while ``watcher`` long-polls host-a's desired
    state; the seconds the long-poll took, once it shows the new lease."""
    etag = (await watcher.get("/hosts/host-a/desired")).json()["etag"]
    started = time.monotonic()
    poll = asyncio.create_task(watcher.get("/hosts/host-a/desired", params={"etag": etag, "wait": WAIT_S}))
    await asyncio.sleep(0.3)  # the long-poll is waiting
    lease = (await changer.post("/leases", json={"device": name}, headers={"X-Device-Loop-User": "alice"})).json()
    answer = (await poll).json()
    assert lease["id"] in [s["lease"] for s in answer["services"]], answer
    return time.monotonic() - started


async def test_a_long_poll_wakes_at_a_change_made_by_another_process(two_coordinators, postgres_database):
    first, second = two_coordinators
    async with httpx2.AsyncClient(base_url=f"{first.url}/api/v1", timeout=60) as one, \
            httpx2.AsyncClient(base_url=f"{second.url}/api/v1", timeout=60) as two:
        assert (await FakeExporter(one, "host-a").beat([device(f"b{i}") for i in range(3)])).status_code == 200

        assert await reserve_and_watch(two, one, "b0") < WAIT_S / 2

        # the channel breaks (a restarted or failed-over server): long-polls still wake, and
        # each process listens again
        admin = await asyncpg.connect(postgres_database)
        listening = ("SELECT {} FROM pg_stat_activity WHERE datname = current_database() "
                     "AND (query LIKE 'LISTEN%' OR query = 'SELECT 1')")  # (the channel's own check)
        try:
            assert await admin.fetchval(listening.format("count(pg_terminate_backend(pid))")) == 2, \
                "each coordinator process listens on a connection of its own"
            assert await reserve_and_watch(two, one, "b1") < WAIT_S / 2
            deadline = time.monotonic() + 10
            while await admin.fetchval(listening.format("count(*)")) < 2:
                assert time.monotonic() < deadline, "a process did not listen again"
                await asyncio.sleep(0.2)
        finally:
            await admin.close()
        assert await reserve_and_watch(one, two, "b2") < WAIT_S / 2
