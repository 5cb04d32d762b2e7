"""Two coordinator processes on one PostgreSQL share one token's budget and its leases at
once (docs/architecture.md, "Shares of one lab": held "in one conditional statement that
cannot overspend, even from two coordinator processes at once"), and renew and end its
leases at once: each hold is settled once (docs/architecture.md, "Leases": one lock order)."""
import asyncio
import time

import asyncpg
import httpx2
import pytest

from conftest import Coordinator
from device_loop.coordinator.identity import issue_token
from device_loop.coordinator.store import Store
from device_loop.core.scopes import TokenScope
from device_loop.core.vocabulary import TokenKind
from lab_in_process import FakeExporter, device

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

BUDGET_S, TTL_S, MOST = 600.0, 70.0, 3
DEVICES = 24


async def tokens(url: str) -> dict[str, dict]:
    store = Store(url)
    await store.connect()
    try:
        return {"host": await issue_token(store, time.time, host="host-a"),
                "bot": await issue_token(store, time.time, "bot", kind=TokenKind.AGENT,
                                         scope=TokenScope(budget_s=BUDGET_S)),
                "bee": await issue_token(store, time.time, "bee", kind=TokenKind.AGENT,
                                         scope=TokenScope(max_leases=MOST, budget_s=10 * BUDGET_S))}
    finally:
        await store.disconnect()


def api(url: str, token: str) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(base_url=f"{url}/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=60)


async def test_two_processes_racing_reserves_never_overspend_a_budget_nor_pass_most_leases_at_once(
        tmp_path, env, postgres_database):
    made = await tokens(postgres_database)
    procs = []
    try:
        for n in range(2):
            (tmp_path / f"c{n}").mkdir()
            procs.append(Coordinator(tmp_path / f"c{n}", env, extra=("--database-url", postgres_database)))
        async with api(procs[0].url, made["host"]["token"]) as host:
            assert (await FakeExporter(host, "host-a").beat([device(f"b{i}") for i in range(DEVICES)])).status_code \
                == 200
        clients = [api(p.url, made[who]["token"]) for who in ("bot", "bee") for p in procs]
        try:
            asked = [c.post("/leases", json={"class": "sim-board", "ttl_s": TTL_S}) for _ in range(12) for c in clients]
            answers = await asyncio.gather(*asked)
        finally:
            for c in clients:
                await c.aclose()
        refusals = {a.json()["error"] for a in answers if a.status_code >= 400}
        assert refusals <= {"budget_spent", "out_of_scope", "none_free", "busy"}, [a.text for a in answers][:5]

        db = await asyncpg.connect(postgres_database)
        try:
            bot, bee = made["bot"]["id"], made["bee"]["id"]
            held = await db.fetchval("SELECT COALESCE(SUM(held_s), 0) FROM leases WHERE token_id = $1 AND state IN "
                                     "('pending', 'active')", bot)
            usage = await db.fetchrow("SELECT held_s, used_s FROM token_usage WHERE token_id = $1", bot)
            live_bee = await db.fetchval("SELECT COUNT(*) FROM leases WHERE token_id = $1 AND state IN "
                                         "('pending', 'active')", bee)
            counted = await db.fetchval("SELECT live_leases FROM token_counts WHERE token_id = $1", bee)
            live_bot = await db.fetchval("SELECT COUNT(*) FROM leases WHERE token_id = $1", bot)
            bee_held = await db.fetchval("SELECT held_s FROM token_usage WHERE token_id = $1", bee)
        finally:
            await db.close()
        assert 0 < held <= BUDGET_S + 1e-6, f"the budget overspent: {held} s held of {BUDGET_S}"
        assert (usage["held_s"], usage["used_s"]) == (pytest.approx(held), 0), "what is held is what leases hold"
        assert 0 < live_bee <= MOST and counted == live_bee, (live_bee, counted)
        assert bee_held == pytest.approx(live_bee * TTL_S), "a lease refused at most leases at once holds nothing"
        granted = sum(a.status_code == 201 for a in answers)
        assert granted == live_bee + live_bot, "every grant is one of theirs"
        await race_renewals_and_releases(procs, made, [a.json() for a in answers if a.status_code == 201],
                                         postgres_database)
    finally:
        for proc in procs:
            proc.stop()


async def usage(db, token_id: str) -> tuple[float, float, float]:
    """(held in token_usage, held by its live leases, used in token_usage) of ``token_id``."""
    row = await db.fetchrow("SELECT held_s, used_s FROM token_usage WHERE token_id = $1", token_id)
    live = await db.fetchval("SELECT COALESCE(SUM(held_s), 0) FROM leases WHERE token_id = $1 AND state IN "
                             "('pending', 'active')", token_id)
    return row["held_s"], live, row["used_s"]


async def race_renewals_and_releases(procs, made: dict, leases: list[dict], url: str) -> None:
    """Each lease renewed three times at once from each process, then renewed and released at
    once: no hold settled twice nor left behind, the budget never passed, no deadlock (a 500)."""
    clients = {(who, n): api(p.url, made[who]["token"]) for who in ("bot", "bee") for n, p in enumerate(procs)}
    owner = {made[who]["id"]: who for who in ("bot", "bee")}
    db = await asyncpg.connect(url)
    try:
        tokens = {lease["id"]: await db.fetchval("SELECT token_id FROM leases WHERE id = $1", lease["id"])
                  for lease in leases}

        def renew(lease_id: str, n: int):
            return clients[owner[tokens[lease_id]], n].post(f"/leases/{lease_id}/renew", json={"ttl_s": TTL_S / 2})

        def release(lease_id: str, n: int):
            return clients[owner[tokens[lease_id]], n].post(f"/leases/{lease_id}/release")

        renewed = await asyncio.gather(*(renew(lease["id"], n) for lease in leases for n in (0, 1, 0, 1, 0, 1)))
        assert {a.status_code for a in renewed} <= {200, 403}, [a.text for a in renewed if a.status_code != 200][:3]
        for token_id, budget in ((made["bot"]["id"], BUDGET_S), (made["bee"]["id"], 10 * BUDGET_S)):
            held, live, used = await usage(db, token_id)
            assert held == pytest.approx(live, abs=1e-6), "what is held is what the live leases hold: none settled " \
                                                          "twice, none left behind"
            assert 0 <= held and held + used <= budget + 1e-6, (held, used, budget)

        ended = await asyncio.gather(*(call(lease["id"], n) for lease in leases
                                       for call, n in ((renew, 0), (release, 1), (renew, 1), (release, 0))))
        assert all(a.status_code < 500 for a in ended), [a.text for a in ended if a.status_code >= 500][:3]
        for token_id in (made["bot"]["id"], made["bee"]["id"]):
            held, live, used = await usage(db, token_id)
            lengths = await db.fetchval("SELECT SUM(ended_at - created_at) FROM leases WHERE token_id = $1", token_id)
            assert (held, live) == (pytest.approx(0, abs=1e-6), 0), "every hold settled once the leases ended"
            assert used == pytest.approx(lengths, abs=1e-3), "what was used is how long the leases lasted"
        counted = await db.fetchval("SELECT live_leases FROM token_counts WHERE token_id = $1", made["bee"]["id"])
        assert counted == 0, counted
    finally:
        await db.close()
        for client in clients.values():
            await client.aclose()
