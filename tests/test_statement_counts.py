"""A lab's size must not show in what one call costs: statements counted per call."""
import pytest

from lab_in_process import FakeExporter, device, in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60), pytest.mark.usefixtures("database")]

UNCHANGED_MAX = 7   # read the host (before and in the transaction), the devices in transition; write the host;
                    # the answer: desired services, adoptions, flashes to begin
CHANGED_FIXED = 9   # besides one per changed device


def wake(rules) -> int:
    """What waking the long-polls costs a write: on PostgreSQL one ``pg_notify`` (every
    coordinator process hears it), on SQLite nothing (one process)."""
    return 1 if rules.store.dialect == "postgresql" else 0


async def count(rules, call) -> int:
    before = rules.store.statements
    response = await call()
    assert response.status_code < 300, response.text
    return rules.store.statements - before


def board(name: str, health: str = "ok") -> dict:
    return device(name, health=health)


@pytest.mark.parametrize("size", [20, 200])
async def test_a_heartbeat_costs_a_fixed_number_of_statements_plus_one_per_change(tmp_path, size):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        exporter = FakeExporter(client(), "host-a")
        names = [f"b{i}" for i in range(size)]
        await exporter.beat([board(n) for n in names])

        unchanged = await count(rules, lambda: exporter.beat([board(n) for n in names]))
        assert unchanged <= UNCHANGED_MAX

        for changed in (1, 5):
            flipped = set(names[:changed])
            cost = await count(rules, lambda: exporter.beat(
                [board(n, "failed" if n in flipped else "ok") for n in names]))
            assert cost <= CHANGED_FIXED + wake(rules) + changed, f"{changed} changed devices of {size} cost {cost} statements"
            await exporter.beat([board(n) for n in names])  # back to healthy

        faulty = [d["name"] for d in (await client().get("/devices")).json() if d["state"] != "idle"]
        assert faulty == [], "the heartbeats above must have been applied, not skipped"


@pytest.mark.parametrize("size", [20, 200])
async def test_reserve_renew_release_cost_the_same_in_any_lab(tmp_path, size):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        await FakeExporter(api, "host-a").beat([board(f"b{i}") for i in range(size)])
        lease = {}

        async def reserve():
            response = await api.post("/leases", json={"device": "b7"}, headers={"Idempotency-Key": "r1"})
            lease.update(response.json())
            return response

        # reserve and release each count the holder's live leases too (the lease limit, one statement)
        assert await count(rules, reserve) <= 8 + wake(rules)
        assert await count(rules, lambda: api.post(f"/leases/{lease['id']}/renew", json={"ttl_s": 60})) <= 4 + wake(rules)
        assert await count(rules, lambda: api.post(f"/leases/{lease['id']}/release",
                                                   headers={"Idempotency-Key": "r2"})) <= 9 + wake(rules)
        assert (await api.get(f"/leases/{lease['id']}")).json()["state"] == "released"
