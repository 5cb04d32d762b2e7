"""Property test of the lease rules: whatever clients and exporters do, in any order,
a device never has two live leases, expiry frees it, a repeated Idempotency-Key changes
nothing, stale or duplicate heartbeats change nothing, and the lab always settles."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab_in_process import FakeExporter, device, in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300), pytest.mark.usefixtures("database")]

DEVICES = ["b0", "b1"]
USERS = ["alice", "bob"]

operations = st.lists(st.one_of(
    st.tuples(st.just("reserve"), st.sampled_from(USERS), st.sampled_from(DEVICES + ["ghost"]),
              st.sampled_from([None, 30, 600]), st.sampled_from([None, "k1", "k2"])),
    st.tuples(st.just("release"), st.sampled_from(USERS), st.integers(0, 5), st.sampled_from([None, "k3"])),
    st.tuples(st.just("renew"), st.sampled_from(USERS), st.integers(0, 5), st.sampled_from([10, 300])),
    st.tuples(st.just("time"), st.sampled_from([1, 20, 45, 400])),
    st.tuples(st.just("heartbeat"), st.sampled_from(["serve", "idle", "stale", "duplicate", "unplug"])),
), min_size=1, max_size=25)


async def snapshot(rules):
    leases = [tuple(r.values()) for r in await rules.store.read("SELECT * FROM leases ORDER BY id")]
    devices = [tuple(r.values()) for r in await rules.store.read(
        "SELECT name, state, host, present, reclaim_lease, conflict_host FROM devices ORDER BY name")]
    return leases, devices


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
async def test_lease_rules_hold_under_any_sequence(tmp_path, ops):
    async with in_process_lab(tmp_path, allocating_timeout_s=40) as (client, rules, clock):
        api = {user: client(user) for user in USERS}
        exporter = FakeExporter(api["alice"], "host-a")
        await exporter.beat([device(d) for d in DEVICES])
        leases: list[tuple[str, str]] = []  # (holder, lease id) in creation order
        answers: dict[tuple[str, str], object] = {}

        async def live_services():
            desired = (await exporter.client.get("/hosts/host-a/desired")).json()["services"]
            return [{"lease": s["lease"], "device": s["device"], "identifier": s["identifier"], "kind": "uart",
                     "endpoints": [{"kind": "uart", "host": "127.0.0.1", "port": 4000}]} for s in desired]

        for op in ops:
            kind = op[0]
            if kind == "reserve":
                _, user, name, ttl, key = op
                body = {"device": name} | ({"ttl_s": ttl} if ttl else {})
                headers = {"Idempotency-Key": key} if key else {}
                before = await snapshot(rules)
                response = await api[user].post("/leases", json=body, headers=headers)
                assert response.status_code in (201, 404, 409, 422), response.text
                if key and (user, key) in answers:
                    first_status, first_body, first_request = answers[(user, key)]
                    if first_request == body:
                        assert (response.status_code, response.json()) == (first_status, first_body)
                        assert await snapshot(rules) == before, "a replayed key changed the lab"
                    else:
                        assert response.status_code == 422
                elif key:
                    answers[(user, key)] = (response.status_code, response.json(), body)
                if response.status_code == 201 and not (key and leases and response.json()["id"] in dict(leases).values()):
                    leases.append((user, response.json()["id"]))
            elif kind in ("release", "renew") and leases:
                _, user, index, extra = op
                holder, lease_id = leases[index % len(leases)]
                if kind == "release":
                    path = f"/leases/{lease_id}/release"
                    headers = {"Idempotency-Key": extra} if extra else {}
                    before = await snapshot(rules)
                    response = await api[user].post(path, headers=headers)
                    first = answers.get((user, extra)) if extra else None
                    if first is not None:
                        if first[2] == path:
                            assert (response.status_code, response.json()) == first[:2]
                            assert await snapshot(rules) == before, "a replayed key changed the lab"
                        else:
                            assert response.status_code == 422  # the key was used for another request
                        continue
                    if extra:
                        answers[(user, extra)] = (response.status_code, response.json(), path)
                else:
                    response = await api[user].post(f"/leases/{lease_id}/renew", json={"ttl_s": extra})
                if user != holder:
                    assert response.status_code == 404
                else:
                    assert response.status_code in (200, 409)
            elif kind == "time":
                clock.advance(op[1])
                await rules.reap()
                now = clock()
                rows = await rules.store.read(
                    "SELECT expires_at FROM leases WHERE state IN ('pending', 'active')")
                assert all(r["expires_at"] > now for r in rows), "an expired lease is still live after the reaper"
            elif kind == "heartbeat":
                mode = op[1]
                if mode in ("stale", "duplicate") and exporter.generation >= 2:
                    before = await snapshot(rules)
                    generation = exporter.generation - (1 if mode == "stale" else 0)
                    response = await exporter.beat([], [], [], generation=generation)
                    assert response.status_code == (409 if mode == "stale" else 200)
                    assert await snapshot(rules) == before, f"a {mode} heartbeat changed the lab"
                elif mode == "unplug":
                    await exporter.beat([device("b0")], [], [])
                else:
                    services = await live_services() if mode == "serve" else []
                    await exporter.beat([device(d) for d in DEVICES], services, [s["lease"] for s in services])

            counts = await rules.store.read(
                "SELECT device, COUNT(*) AS n FROM leases WHERE state IN ('pending', 'active') GROUP BY device")
            assert all(r["n"] <= 1 for r in counts), "two live leases on one device"
            for d in (await api["alice"].get("/devices")).json():
                live = [r for r in await rules.store.read(
                    "SELECT holder FROM leases WHERE device = :d AND state IN ('pending', 'active')", d=d["name"])]
                assert d["holder"] == (live[0]["holder"] if live else None)
                if live:
                    assert d["state"] in ("allocating", "in_use", "offline")

        # whatever happened, once every lease has run out and the exporter runs nothing, all is idle
        clock.advance(3600)
        await exporter.beat([device(d) for d in DEVICES], [], [])
        await rules.reap()
        await exporter.beat([device(d) for d in DEVICES], [], [])
        assert {d["name"]: d["state"] for d in (await api["alice"].get("/devices")).json()} == dict.fromkeys(DEVICES, "idle")
