"""Credentials and per-person limits against hostile users (docs/architecture.md, "Identity"): no stored answer keeps
a credential, the lease limit holds through two coordinator processes, and nobody may call
themselves by a name the lab's own actions use."""
from __future__ import annotations

import json

import pytest

from device_loop.core.gate import gate_secret

from conftest import coordinator_pair
from device_loop.coordinator.identity import issue_token
from lab_in_process import FakeExporter, device, in_process_lab
from live_lab import LabDatabase, Spread

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]


async def every_row(store) -> list[tuple[str, str]]:
    """(table, row as text) for every row of every table of the lab's database."""
    if store.dialect == "postgresql":
        tables = [r["tablename"] for r in await store.read("SELECT tablename FROM pg_tables WHERE schemaname = "
                                                           "'public'")]
    else:
        tables = [r["name"] for r in await store.read("SELECT name FROM sqlite_master WHERE type = 'table'")]
    rows = []
    for table in tables:
        rows += [(table, json.dumps(row, default=str)) for row in await store.read(f"SELECT * FROM {table}")]
    return rows


async def holding(store, secret: str) -> set[str]:
    return {table for table, row in await every_row(store) if secret in row}


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_no_stored_answer_keeps_a_credential(tmp_path):
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        root = client(token=(await issue_token(rules.store, rules.clock, "root", admin=True))["token"])
        once = {"Idempotency-Key": "token-for-alice"}
        made = await root.post("/admin/tokens", json={"user": "alice"}, headers=once)
        assert made.status_code == 201 and made.json()["token"].startswith("dl_")
        token = made.json()["token"]
        assert await holding(rules.store, token) == set(), "a new token sits in no table"
        replay = await root.post("/admin/tokens", json={"user": "alice"}, headers=once)
        assert replay.status_code == 201 and replay.json()["token"] is None
        assert replay.json()["id"] == made.json()["id"] and "already done" in replay.json()["note"]

        alice = client(token=token)
        exporter = FakeExporter(client(token=(await issue_token(rules.store, rules.clock, host="host-a"))["token"]),
                                "host-a")
        await exporter.beat([device("b0")])
        key = {"Idempotency-Key": "reserve-b0"}
        lease = (await alice.post("/leases", json={"device": "b0"}, headers=key)).json()
        (row,) = await rules.store.read("SELECT secret FROM leases")
        master = row["secret"]
        assert master and await holding(rules.store, master) == {"leases"}, "only the live lease keeps its secret"
        secret = gate_secret(master, "camera")  # (the camera's gate's, as its exporter derives it)
        camera = {"kind": "video", "host": "127.0.0.1", "port": 5000, "protocol": "http",
                  "url": f"http://127.0.0.1:5000/{secret}/", "params": {"stream": "stream.mjpg",
                                                                       "snapshot": "snapshot.jpg"}}
        service = {"lease": lease["id"], "device": "b0", "identifier": "sim:b0", "kind": "video", "endpoints": [camera]}
        await exporter.beat([device("b0")], [service], [lease["id"]])
        renew_key = {"Idempotency-Key": "renew-b0"}
        renewed = (await alice.post(f"/leases/{lease['id']}/renew", json={"ttl_s": 600}, headers=renew_key)).json()
        assert secret in renewed["endpoints"][0]["url"], "the first answer has the capability URL"
        assert renewed["endpoints"][0]["secret"] == secret and master not in json.dumps(renewed)
        # the live lease's row, and its host's snapshot of the services it runs now: nothing else
        assert await holding(rules.store, secret) == {"hosts"}, "not in a stored answer's URLs either"
        replayed = (await alice.post(f"/leases/{lease['id']}/renew", json={"ttl_s": 600}, headers=renew_key)).json()
        assert replayed == renewed, "while the lease lives a replay is the first answer, secret and URLs included"
        assert (await alice.post("/leases", json={"device": "b0"}, headers=key)).json()["id"] == lease["id"]

        await alice.post(f"/leases/{lease['id']}/release")
        await exporter.beat([device("b0")])  # its services stopped
        assert await holding(rules.store, master) == set(), "a lease's secret dies with it"
        assert await holding(rules.store, secret) == set(), "and its gates' with it"
        after = (await alice.post(f"/leases/{lease['id']}/renew", json={"ttl_s": 600}, headers=renew_key)).json()
        assert secret not in json.dumps(after) and all(e.get("secret") is None for e in after["endpoints"])


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_the_lease_limit_counts_every_way_a_lease_ends(tmp_path):
    async with in_process_lab(tmp_path, max_leases_per_user=2) as (client, rules, clock):
        alice, root = client("alice"), client("root")
        exporter = FakeExporter(alice, "host-a")
        await exporter.beat([device(f"b{n}") for n in range(6)])

        async def reserve(name: str, ttl_s: float = 60):
            return await alice.post("/leases", json={"device": name, "ttl_s": ttl_s})

        first = (await reserve("b0")).json()
        assert (await reserve("b1", 5)).status_code == 201
        over = await reserve("b2")
        assert over.status_code == 409 and over.json()["error"] == "too_many_leases"
        assert (await alice.post(f"/leases/{first['id']}/release")).status_code == 200
        third = await reserve("b2")
        assert third.status_code == 201, "a released lease no longer counts"
        clock.advance(6)
        await rules.reap()  # the 5 s lease expires
        assert (await reserve("b3")).status_code == 201, "an expired lease no longer counts"
        assert (await root.post(f"/admin/leases/{third.json()['id']}/revoke")).status_code == 200
        fourth = await reserve("b4")
        assert fourth.status_code == 201, "a revoked lease no longer counts"
        assert (await root.post("/admin/devices/b4/retire", json={"force": True})).status_code == 200
        assert (await reserve("b5")).status_code == 201, "nor one revoked by retiring its device"
        assert (await reserve("b0")).status_code == 409
        assert (await rules.images.images_sql.user_counts("alice"))["live_leases"] == 2


def test_the_lease_limit_holds_under_concurrent_reserves_through_two_processes(tmp_path, env, postgres_database):
    with coordinator_pair(tmp_path, env, postgres_database, "--max-leases-per-user", "10") as procs:
        spread, db = Spread(procs), LabDatabase(postgres_database)
        names = [f"b{n}" for n in range(30)]
        beat = FakeExporter(None, "host-a").report([device(name) for name in names])
        assert spread.request(0, "POST", "/hosts/host-a/heartbeat", json=beat).status_code == 200

        def reserve(n: int) -> int:
            return spread.request(n, "POST", "/leases", json={"device": names[n]}).status_code

        statuses = spread.at_once(*[(reserve, n) for n in range(30)])
        assert sorted(statuses) == [201] * 10 + [409] * 20, statuses
        live = db.rows("SELECT COUNT(*) AS n FROM leases WHERE holder = 'alice' AND state IN ('pending', 'active')")
        assert live[0]["n"] == 10
        db.close()
        spread.close()


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_nobody_is_called_by_the_names_the_lab_acts_under(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        await FakeExporter(client(), "host-a").beat([device("b0")])
        for name in ("coordinator", "Coordinator", "anonymous", "exporter:host-a", "database:root", "a b"):
            refused = await client(name).post("/leases", json={"device": "b0"})
            assert refused.status_code == 400 and refused.json()["error"] == "bad_user", (name, refused.text)
        for name in ("coordinator", "anonymous"):
            made = await client().post("/admin/tokens", json={"user": name})
            assert made.status_code == 422 and "the lab's own actions" in made.json()["message"]
        assert (await client("alice").post("/leases", json={"device": "b0"})).status_code == 201
