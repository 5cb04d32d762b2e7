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


def host_lock(rules) -> int:
    """The statement that takes the device's host's lock before a lease begins or ends: on
    PostgreSQL (SQLite has one writer: nothing to take; docs/architecture.md, "Leases")."""
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
        assert await count(rules, reserve) <= 8 + wake(rules) + host_lock(rules)
        assert await count(rules, lambda: api.post(f"/leases/{lease['id']}/renew", json={"ttl_s": 60})) <= 4 + wake(rules)
        assert await count(rules, lambda: api.post(f"/leases/{lease['id']}/release",
                                                   headers={"Idempotency-Key": "r2"})) <= 9 + wake(rules) + host_lock(rules)
        assert (await api.get(f"/leases/{lease['id']}")).json()["state"] == "released"


@pytest.mark.parametrize("size", [20, 200])
async def test_a_keepalive_lease_costs_what_a_lease_costs_and_a_keep_alive_less_than_a_renewal(tmp_path, size):
    """(docs/architecture.md, "Leases that live as long as their client"): its keepalive and end
    are columns of the same row; a keep-alive is the same update, without an audit entry."""
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        await FakeExporter(api, "host-a").beat([board(f"b{i}") for i in range(size)])
        lease = {}

        async def reserve():
            response = await api.post("/leases", json={"device": "b7", "keepalive_s": 30},
                                      headers={"Idempotency-Key": "r1"})
            lease.update(response.json())
            return response

        assert await count(rules, reserve) <= 8 + wake(rules) + host_lock(rules)
        assert await count(rules, lambda: api.post(f"/leases/{lease['id']}/renew", json={})) <= 3 + wake(rules)
        assert await count(rules, lambda: api.post(f"/leases/{lease['id']}/renew", json={"ttl_s": 60})) <= 4 + wake(rules)


# ---- who gets the next lease: a grant from a ticket, a reserve by class -------------------------

GRANT_CLASS = "grant-class"
GRANT_FIXED = 9  # the device's facts, its first ticket; the lease, its count, the device's state and ring log,
                 # the audit entry; the ticket granted, its requester's open tickets counted down


def classed(name: str, health: str = "ok", tags=("sim",)) -> dict:
    """A device of ``GRANT_CLASS`` as an exporter reports it."""
    return {**device(name, health=health), "class": GRANT_CLASS, "tags": list(tags)}


def grant_lab_boards(size: int) -> list[dict]:
    """b0 healthy (the device to be freed and granted); the others faulty, so that nothing
    of the class is free and every reserve of it queues; odd ones tagged ``odd``."""
    return [classed(f"b{i}", "ok" if i == 0 else "failed", ("sim", "odd") if i % 2 else ("sim",))
            for i in range(size)]


async def add_waiting_ticket(rules, ticket_id: str, requester: str, name: str | None, device_class: str | None,
                             tags: list[str]) -> None:
    """A waiting ticket written as ``Scheduler`` writes one, without the reserve that comes
    first (a queue by class reads the lab's devices to say why none is free: slow at 200)."""
    async with rules.store.tx():
        assert await rules.scheduler.tickets_sql.count_ticket(requester, None)
        await rules.scheduler.tickets_sql.insert_ticket({
            "id": ticket_id, "requester": requester, "kind": "interactive",
            "device": name, "device_class": device_class, "tags": tags, "ttl_s": 600.0,
            "state": "waiting", "created_at": rules.clock(), "granted_at": None, "ended_at": None,
            "lease_id": None, "granted_device": None, "reason": ""})


async def test_a_grant_from_a_ticket_costs_the_same_with_1_or_200_waiting_and_20_or_200_devices(tmp_path):
    """The heartbeat that completes b0's reclaim grants it to the first waiting ticket that
    matches, in its transaction: the same number of statements whatever the queue's length
    and the lab's size (and more than the same heartbeat with nothing waiting, by the grant's
    fixed cost)."""
    costs: dict[tuple[int, int], int] = {}
    for size in (20, 200):
        async with in_process_lab(tmp_path, max_tickets_per_user=0, max_leases_per_user=0) as (client, rules, clock):
            api, holder = client(), client("holder")
            exporter = FakeExporter(api, "host-a")
            boards = grant_lab_boards(size)
            await exporter.beat(boards)

            async def freed(lease_id: str, holder_name: str) -> int:
                """Release the lease, then the heartbeat that completes the reclaim: its statements."""
                assert (await client(holder_name).post(f"/leases/{lease_id}/release")).status_code == 200
                return await count(rules, lambda: exporter.beat(boards))

            async def queue(user: str, want: dict) -> str:
                clock.advance(1)  # first come, first served: each after the last
                answer = await client(user).post("/leases", json={**want, "queue": True})
                assert answer.status_code == 201 and answer.json()["state"] == "waiting", answer.text
                return answer.json()["ticket"]

            async def granted(ticket_id: str) -> dict:
                ticket = await rules.scheduler.tickets_sql.ticket(ticket_id)
                assert (ticket["state"], ticket["granted_device"]) == ("granted", "b0"), ticket
                return ticket

            lease = (await holder.post("/leases", json={"device": "b0"})).json()
            costs[size, 0] = await freed(lease["id"], "holder")  # nothing waits: nothing granted
            lease = (await holder.post("/leases", json={"device": "b0"})).json()
            alone = await queue("user0", {"class": GRANT_CLASS})
            costs[size, 1] = await freed(lease["id"], "holder")
            first = await granted(alone)

            served = await queue("user1", {"class": GRANT_CLASS})  # the first of 200 that b0 matches
            for n in range(199):  # the others: mostly what b0 is not (another device, a tag b0 lacks)
                clock.advance(1)
                want = [(f"b{1 + n % (size - 1)}", None, []), (None, GRANT_CLASS, ["odd"]), (None, None, ["odd"]),
                        (None, GRANT_CLASS, [])][n % 4]
                await add_waiting_ticket(rules, f"tk-filler-{n}", f"user{n % 4}", *want)
            assert len(await rules.scheduler.tickets_sql.waiting_tickets(1000, 0)) == 200
            costs[size, 200] = await freed(first["lease_id"], "user0")
            await granted(served)
    with_grant = {costs[key] for key in costs if key[1]}
    assert len(with_grant) == 1, f"a grant's statements depend on the queue or the lab: {costs}"
    assert costs[20, 0] == costs[200, 0] < with_grant.pop() <= costs[20, 0] + GRANT_FIXED, costs


@pytest.mark.parametrize("tags", [[], ["odd"]])
async def test_a_reserve_by_class_costs_the_same_at_20_and_200_devices(tmp_path, tags):
    costs = {}
    for size in (20, 200):
        async with in_process_lab(tmp_path) as (client, rules, clock):
            api = client()
            await FakeExporter(api, "host-a").beat(
                [classed(f"b{i}", tags=("sim", "odd") if i % 2 else ("sim",)) for i in range(size)])
            lease = {}

            async def reserve(body: dict):
                response = await api.post("/leases", json=body, headers={"Idempotency-Key": f"k{len(costs)}"})
                lease.update(response.json())
                return response

            costs[size, "class"] = await count(rules, lambda: reserve({"class": GRANT_CLASS, "tags": tags}))
            assert costs[size, "class"] <= 8 + wake(rules) + host_lock(rules), costs
            assert lease["device"] in {f"b{i}" for i in range(size)} and (not tags or lease["device"] in
                                                                           {f"b{i}" for i in range(1, size, 2)})
            assert (await api.post(f"/leases/{lease['id']}/release")).status_code == 200
            costs[size, "name"] = await count(rules, lambda: reserve({"device": "b7"}))
            assert lease["device"] == "b7", lease
            # what it needs is read in the same query (docs/architecture.md, "Who gets the next lease")
            costs[size, "needs"] = await count(rules, lambda: reserve({"class": GRANT_CLASS, "tags": tags,
                                                                       "needs": "real-hw"}))
            assert costs[size, "needs"] == costs[size, "class"] and lease["device"] != "b7", (costs, lease)
    assert costs[20, "class"] == costs[200, "class"], f"a reserve by class costs more in a bigger lab: {costs}"
    assert costs[20, "name"] == costs[200, "name"], costs
    # (a reserve by name reads its device; one by class reads the free ones of the class instead)
    assert costs[20, "class"] <= costs[20, "name"], costs
