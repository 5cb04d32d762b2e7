"""The coordinator's REST rules, driven in-process with a hand-moved clock."""
import json
import sqlite3

import asyncpg
import pytest

from conftest import SQLITE_ONLY
from device_loop.coordinator.store import core as store_core
from device_loop.coordinator.identity import issue_token
from device_loop.coordinator.migrations import MIGRATIONS
from device_loop.coordinator.store import Store
from device_loop.core import PROTOCOL_VERSION
from lab_in_process import FakeClock, FakeExporter, _database, _lab, device, in_process_lab, leased_board
from test_flash_rules import board, lab_with_board

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30), pytest.mark.usefixtures("database")]

# the rules here run the same SQL on either database, which the store's own tests, the
# statement counts and the OpenAPI run check on PostgreSQL: SQLite only (docs/architecture.md, "Testing")
DATABASES = SQLITE_ONLY


async def state_of(api, name):
    return (await api.get(f"/devices/{name}")).json()["state"]


async def test_bad_input_gets_clear_4xx(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        await FakeExporter(api, "host-a").beat([device("b0")])
        cases = [
            (await api.post("/leases", content=b"{nope", headers={"Content-Type": "application/json"}), 400,
             "bad_request"),
            (await api.post("/leases", json={}), 422, "invalid"),
            (await api.post("/leases", json={"device": "b0", "ttl_s": -5}), 422, "invalid"),
            (await api.post("/leases", json={"device": "b0", "ttl_s": 30 * 86400}), 422, "ttl_too_long"),
            (await api.post("/leases", json={"device": "b0", "owner": "mallory"}), 422, "invalid"),
            (await api.post("/leases", json={"device": "nope"}), 404, "unknown_device"),
            (await api.get("/leases/lease-nope"), 404, "unknown_lease"),
            (await api.get("/leases/lease-nope", params={"wait": "soon"}), 400, "bad_request"),
            (await api.get("/leases/lease-nope", params={"wait": "600"}), 400, "bad_request"),
            (await api.get("/devices/nope/log"), 404, "unknown_device"),
            (await api.get("/no/such/route"), 404, "not_found"),
            (await api.delete("/devices"), 405, "method_not_allowed"),
            (await api.post("/leases/lease-nope/renew", json={"ttl_s": "x"}), 422, "invalid"),
            (await api.post("/leases", json={"device": "b0", "ttl_s": True}), 422, "invalid"),
            (await api.post("/leases", json={"device": "b0", "ttl_s": "60"}), 422, "invalid"),
            (await api.post("/leases", json={"device": "b0", "ttl_s": 1e308}), 422, "ttl_too_long"),
            (await api.post("/leases", json={"device": "b0", "ttl_s": 3651 * 86400}), 422, "ttl_too_long"),
        ]
        for response, status, code in cases:
            assert (response.status_code, response.json()["error"]) == (status, code), response.text
            assert response.json()["message"]
        assert "known devices: b0" in cases[5][0].json()["message"]
        assert cases[-2][0].json()["message"] == "a ttl of over a century is over this lab's maximum of 7d"
        assert cases[-1][0].json()["message"] == "a ttl of 3651d is over this lab's maximum of 7d"


async def test_reports_cannot_carry_coordinator_owned_fields(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        exporter = FakeExporter(client(), "host-a")
        with_mediated = {**device("b0"), "mediated": False}
        response = await exporter.beat([with_mediated])
        assert response.status_code == 422 and "mediated" in response.json()["message"]
        service = {"lease": "lease-x", "device": "b0", "identifier": "sim:b0", "kind": "uart", "owner": "me",
                   "endpoints": []}
        assert (await exporter.beat([device("b0")], [service])).status_code == 422
        bad_port = {**service, "endpoints": [{"kind": "uart", "host": "h", "port": 70000}]}
        del bad_port["owner"]
        assert (await exporter.beat([device("b0")], [bad_port])).status_code == 422
        assert (await exporter.beat([device("lease-1")])).status_code == 422
        mismatch = await exporter.beat([device("b0")], protocol=PROTOCOL_VERSION + 1)
        assert mismatch.status_code == 400 and mismatch.json()["error"] == "protocol_mismatch"
        assert f"protocol {PROTOCOL_VERSION + 1}" in mismatch.json()["message"]
        assert f"speaks {PROTOCOL_VERSION}" in mismatch.json()["message"]
        assert (await client().get("/devices")).json() == []


async def test_stale_and_duplicate_heartbeats_change_nothing(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        assert (await exporter.beat([device("b0"), device("b1")])).status_code == 200
        assert (await exporter.beat([device("b0"), device("b1")])).status_code == 200  # generation 2
        stale = await exporter.beat([device("b0")], generation=1)
        assert stale.status_code == 409 and stale.json()["error"] == "stale_heartbeat"
        duplicate = await exporter.beat([device("b0")], generation=2)
        assert duplicate.status_code == 200 and "services" in duplicate.json()
        assert await state_of(api, "b1") == "idle"
        # a new boot's first snapshot replaces everything the host said before
        exporter.reboot()
        assert (await exporter.beat([device("b0")])).status_code == 200
        assert await state_of(api, "b1") == "offline"
        assert await state_of(api, "b0") == "idle"


async def test_lease_lifecycle_with_expiry_and_reclaim(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([device("b0")])
        lease = (await api.post("/leases", json={"device": "b0", "ttl_s": 60})).json()
        assert lease["state"] == "pending" and lease["device_state"] == "allocating"
        desired = (await exporter.beat([device("b0")])).json()
        assert [(s["lease"], s["identifier"]) for s in desired["services"]] == [(lease["id"], "sim:b0")]
        await exporter.serve(lease)
        active = (await api.get(f"/leases/{lease['id']}")).json()
        assert active["state"] == "active" and active["ready"] and active["endpoints"][0]["port"] == 4000

        clock.advance(61)
        await exporter.serve(lease)
        await rules.reap()
        expired = (await api.get(f"/leases/{lease['id']}")).json()
        assert expired["state"] == "expired" and expired["endpoints"] == []
        assert expired["device_state"] == "reclaiming"
        # still reclaiming while the exporter has not seen the lease end or still runs it
        await exporter.serve(lease)
        assert await state_of(api, "b0") == "reclaiming"
        await exporter.beat([device("b0")], [], [])
        assert await state_of(api, "b0") == "idle"
        again = await api.post("/leases", json={"device": "b0"})
        assert again.status_code == 201


async def test_reclaim_waits_for_orphans(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, exporter, lease = await leased_board(client)
        await api.post(f"/leases/{lease['id']}/release")
        orphan = {"pid": 4242, "command": "picocom /dev/ttyUSB0", "cgroup": "/user.slice/session-3.scope"}
        await exporter.beat([device("b0", busy_by=[orphan])], [], [])
        info = (await api.get("/devices/b0")).json()
        assert info["state"] == "reclaiming" and info["busy_by"] == [{**orphan, "program": "picocom"}]
        assert (await api.post("/leases", json={"device": "b0"})).status_code == 409
        await exporter.beat([device("b0")], [], [])
        assert await state_of(api, "b0") == "idle"


async def test_only_the_holder_sees_renews_and_releases(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        alice, bob = client("alice"), client("bob")
        await FakeExporter(alice, "host-a").beat([device("b0")])
        lease = (await alice.post("/leases", json={"device": "b0"})).json()
        for response in [await bob.get(f"/leases/{lease['id']}"),
                         await bob.post(f"/leases/{lease['id']}/renew", json={"ttl_s": 60}),
                         await bob.post(f"/leases/{lease['id']}/release")]:
            assert response.status_code == 404
            assert response.json() == {"error": "unknown_lease", "message": f"unknown lease {lease['id']!r}"}
        refused = await bob.post("/leases", json={"device": "b0"})
        assert refused.status_code == 409 and "held by alice until" in refused.json()["message"]
        assert (await bob.get("/devices/b0")).json()["holder"] == "alice"
        assert (await alice.get(f"/leases/{lease['id']}")).json()["state"] == "pending"


async def test_idempotency_key_replays_and_is_scoped_to_the_caller(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        alice, bob = client("alice"), client("bob")
        await FakeExporter(alice, "host-a").beat([device("b0"), device("b1")])
        key = {"Idempotency-Key": "k1"}
        first = await alice.post("/leases", json={"device": "b0"}, headers=key)
        repeat = await alice.post("/leases", json={"device": "b0"}, headers=key)
        assert first.status_code == repeat.status_code == 201
        assert first.json() == repeat.json()
        assert len((await alice.get("/leases")).json()) == 1
        other = await alice.post("/leases", json={"device": "b1"}, headers=key)
        assert other.status_code == 422 and other.json()["error"] == "idempotency_key_reused"
        bobs = await bob.post("/leases", json={"device": "b1"}, headers=key)
        assert bobs.status_code == 201 and bobs.json()["holder"] == "bob"
        # a refusal is replayed too, even after the device became free
        refused = await bob.post("/leases", json={"device": "b0"}, headers={"Idempotency-Key": "k2"})
        assert refused.status_code == 409
        await alice.post(f"/leases/{first.json()['id']}/release")
        replay = await bob.post("/leases", json={"device": "b0"}, headers={"Idempotency-Key": "k2"})
        assert replay.status_code == 409 and replay.json() == refused.json()


async def test_allocation_timeout_reports_the_service_error(tmp_path):
    async with in_process_lab(tmp_path, allocating_timeout_s=30) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([device("b0")])
        lease = (await api.post("/leases", json={"device": "b0"})).json()
        failure = {"lease": lease["id"], "device": "b0", "identifier": "sim:b0", "kind": "uart",
                   "error": "uart: ser2net: Address already in use"}
        await exporter.beat([device("b0")], [failure], [lease["id"]])
        pending = (await api.get(f"/leases/{lease['id']}")).json()
        assert pending["state"] == "pending" and "Address already in use" in pending["reason"]
        clock.advance(31)
        await exporter.beat([device("b0")], [failure], [lease["id"]])
        await rules.reap()
        failed = (await api.get(f"/leases/{lease['id']}")).json()
        assert failed["state"] == "failed" and "Address already in use" in failed["end_reason"]
        assert failed["device_state"] == "reclaiming"


async def test_silent_host_goes_offline_and_lease_survives(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, exporter, lease = await leased_board(client)
        clock.advance(11)
        await rules.reap()
        offline = (await api.get(f"/leases/{lease['id']}")).json()
        assert offline["state"] == "active" and offline["device_state"] == "offline"
        assert not offline["ready"] and "host host-a is offline" in offline["reason"]
        hosts = (await api.get("/hosts")).json()
        assert hosts[0]["online"] is False and hosts[0]["heartbeat_age_s"] == 11
        await exporter.serve(lease)
        back = (await api.get(f"/leases/{lease['id']}")).json()
        assert back["ready"] and back["device_state"] == "in_use"
        causes = [e["cause"] for e in (await api.get("/devices/b0/log")).json()]
        assert "host host-a stopped heartbeating" in causes and "host is heartbeating again" in causes


async def test_a_host_claiming_another_hosts_device_neither_takes_it_nor_locks_it_out(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        a, b = FakeExporter(api, "host-a"), FakeExporter(api, "host-b")
        await a.beat([device("b0")])
        for _ in range(3):
            await b.beat([device("b0", health="failed")])
            await a.beat([device("b0")])
            info = (await api.get("/devices/b0")).json()
            assert info["state"] == "idle" and info["host"] == "host-a" and info["health"] == "ok"
            assert info["conflict_hosts"] == ["host-a", "host-b"]
        assert [h["claims"] for h in (await api.get("/hosts")).json()] == [[], ["b0"]]

        # the owner goes on serving it: a lease, its services on host-a only
        lease = (await api.post("/leases", json={"device": "b0"})).json()
        assert lease["state"] == "pending", lease
        assert (await b.beat([device("b0")])).json()["services"] == []
        assert [s["lease"] for s in (await a.serve(lease)).json()["services"]] == [lease["id"]]
        assert (await api.get(f"/leases/{lease['id']}")).json()["ready"]

        # the same identifier under another name is the same device
        await b.beat([device("other-name", identifier="sim:b0")])
        assert (await api.get("/devices/other-name")).status_code == 404
        assert (await api.get("/devices/b0")).json()["conflict_hosts"] == ["host-a", "host-b"]
        await b.beat([])
        info = (await api.get("/devices/b0")).json()
        assert info["conflict_hosts"] == [] and info["state"] == "in_use"
        assert [e["cause"] for e in (await api.get("/devices/b0/log")).json()
                if "host-b" in e["cause"]] == [], "a claim is not a state change"


async def test_device_moves_to_another_host_and_keeps_its_lease(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        a, b = FakeExporter(api, "host-a"), FakeExporter(api, "host-b")
        await a.beat([device("b0")])
        await b.beat([])
        lease = (await api.post("/leases", json={"device": "b0"})).json()
        await a.serve(lease)
        await a.beat([], [], [lease["id"]])  # unplugged from host-a
        assert (await api.get(f"/leases/{lease['id']}")).json()["device_state"] == "offline"
        await b.beat([device("b0")])  # plugged into host-b
        assert [s["lease"] for s in (await b.beat([device("b0")])).json()["services"]] == [lease["id"]]
        await b.serve(lease, port=5000)
        moved = (await api.get(f"/leases/{lease['id']}")).json()
        assert moved["host"] == "host-b" and moved["ready"] and moved["endpoints"][0]["port"] == 5000
        assert any("moved from host host-a to host-b" in e["cause"] for e in (await api.get("/devices/b0/log")).json())


async def test_faulty_device_is_refused_and_recovers(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([device("b0", health="failed"), device("b1")])
        refused = await api.post("/leases", json={"device": "b0"})
        assert refused.status_code == 409 and refused.json()["error"] == "faulty"
        assert "try b1" in refused.json()["message"]
        await exporter.beat([device("b0"), device("b1")])
        assert await state_of(api, "b0") == "idle"


async def test_ring_log_keeps_last_twenty(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        for _ in range(15):
            await exporter.beat([device("b0", health="failed")])
            await exporter.beat([device("b0")])
        log = (await api.get("/devices/b0/log")).json()
        assert len(log) == 20 and log[-1]["to"] == "idle" and log[-1]["actor"] == "exporter:host-a"


async def test_numbers_out_of_range_are_refused_not_crashed(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        assert (await exporter.beat([device("b0")], generation=2**64)).status_code == 422
        infinite = await api.post("/leases", content=b'{"device": "b0", "ttl_s": Infinity}',
                                  headers={"content-type": "application/json"})
        assert infinite.status_code == 422
        twice = await exporter.beat([device("b0"), device("b1", identifier="sim:b0")])
        assert twice.status_code == 422 and "sim:b0" in twice.json()["message"]


async def test_identifiers_change_hands_on_one_host(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([device("b0", identifier="cam-1"), device("b1", identifier="uart-1")])
        # the admin moves the camera to b1 in the config, and renames b0
        moved = {**device("b1", identifier="uart-1")}
        moved["resources"] = moved["resources"] + [{"kind": "video", "plugin": "sim", "identifier": "cam-1"}]
        response = await exporter.beat([moved, device("b0-new", identifier="cam-9")])
        assert response.status_code == 200, response.text
        b1 = (await api.get("/devices/b1")).json()
        assert {r["identifier"] for r in b1["resources"]} == {"uart-1", "cam-1"} and b1["state"] == "idle"
        renamed = await exporter.beat([device("b1-renamed", identifier="uart-1"), device("b0-new", identifier="cam-9")])
        assert renamed.status_code == 200
        assert await state_of(api, "b1-renamed") == "idle"
        assert await state_of(api, "b1") == "offline"


async def test_claims_of_a_silent_host_are_dropped(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        a, b = FakeExporter(api, "host-a"), FakeExporter(api, "host-b")
        await a.beat([device("b0")])
        await b.beat([device("b0")])
        assert (await api.get("/devices/b0")).json()["conflict_hosts"] == ["host-a", "host-b"]
        clock.advance(11)
        await a.beat([device("b0")])
        await rules.reap()
        info = (await api.get("/devices/b0")).json()
        assert info["conflict_hosts"] == [] and info["state"] == "idle"


async def test_a_replaced_boot_is_refused_so_two_exporters_with_one_name_do_not_flap(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        first, second = FakeExporter(api, "pi"), FakeExporter(api, "pi")
        assert (await first.beat([device("b0")])).status_code == 200
        assert (await second.beat([device("b1")])).status_code == 200
        for _ in range(3):
            refused = await first.beat([device("b0")])
            assert refused.status_code == 409 and refused.json()["error"] == "superseded_boot"
            assert "own [exporter] name" in refused.json()["message"]
            assert (await second.beat([device("b1")])).status_code == 200
        assert await state_of(api, "b1") == "idle"
        assert len((await api.get("/devices/b1/log")).json()) == 1


async def test_a_replaced_boot_takes_over_once_its_successor_is_gone(tmp_path):
    async with in_process_lab(tmp_path, offline_after_min_s=10) as (client, rules, clock):
        api = client()
        first, second = FakeExporter(api, "pi"), FakeExporter(api, "pi")
        assert (await first.beat([device("b0")])).status_code == 200
        assert (await second.beat([device("b0")], stopping=True)).status_code == 200  # came, and said goodbye
        assert (await first.beat([device("b0")])).status_code == 200, "the first may serve again"
        assert await state_of(api, "b0") == "idle"

        second.reboot()
        assert (await second.beat([device("b0")])).status_code == 200  # a newer start again
        assert (await first.beat([device("b0")])).status_code == 409
        clock.advance(60)
        await rules.reap()  # ... which went silent
        assert (await first.beat([device("b0")])).status_code == 200
        assert await state_of(api, "b0") == "idle"


async def test_active_lease_is_not_ready_while_its_services_are_rebuilt(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, exporter, lease = await leased_board(client)
        exporter.reboot()  # killed and restarted: runs nothing yet
        await exporter.beat([device("b0")])
        rebuilding = (await api.get(f"/leases/{lease['id']}")).json()
        assert rebuilding["state"] == "active" and not rebuilding["ready"] and rebuilding["endpoints"] == []
        assert "restarting the services" in rebuilding["reason"]
        await exporter.serve(lease, port=4001)
        assert (await api.get(f"/leases/{lease['id']}")).json()["ready"]


async def test_no_secret_outlives_its_lease(tmp_path):
    async with in_process_lab(tmp_path, single_user=False, gated=True) as (client, rules, clock):
        from device_loop.coordinator.identity import issue_token
        alice = client(token=(await issue_token(rules.store, rules.clock, "alice"))["token"])
        exporter = FakeExporter(client(token=(await issue_token(rules.store, rules.clock, host="host-a"))["token"]),
                                "host-a")
        await exporter.beat([device("b0")])
        lease = (await alice.post("/leases", json={"device": "b0"}, headers={"Idempotency-Key": "k"})).json()
        await exporter.serve(lease)
        renewed = (await alice.post(f"/leases/{lease['id']}/renew", json={"ttl_s": 600},
                                    headers={"Idempotency-Key": "r"})).json()
        secret = renewed["endpoints"][0]["secret"]
        assert secret
        stored = await rules.store.read("SELECT body FROM idempotency")
        assert all(secret not in row["body"] for row in stored), "a stored answer keeps no secret"
        replay = (await alice.post(f"/leases/{lease['id']}/renew", json={"ttl_s": 600},
                                   headers={"Idempotency-Key": "r"})).json()
        assert replay["endpoints"][0]["secret"] == secret, "a replay while the lease lives has it, as the first answer"
        await alice.post(f"/leases/{lease['id']}/release")
        assert (await rules.store.read("SELECT secret FROM leases"))[0]["secret"] is None
        after = (await alice.post(f"/leases/{lease['id']}/renew", json={"ttl_s": 600},
                                  headers={"Idempotency-Key": "r"})).json()
        assert after["id"] == lease["id"] and secret not in json.dumps(after)


async def test_a_deeply_nested_body_is_a_400_not_a_crash(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        deep = "[" * 1000 + "]" * 1000
        for path in ("/leases", "/hosts/host-a/heartbeat", "/leases/lease-x/flash"):
            answer = await api.post(path, content=deep, headers={"Content-Type": "application/json"})
            assert answer.status_code == 400 and answer.json()["error"] == "bad_request", (path, answer.text)
        mcp = await api.post("http://127.0.0.1/mcp", content='{"jsonrpc": "2.0", "id": 1, "method": "tools/list", '
                                                            f'"params": {deep}}}',
                             headers={"Content-Type": "application/json",
                                      "Accept": "application/json, text/event-stream"})
        assert mcp.status_code == 400


async def test_after_a_coordinator_outage_hosts_get_their_periods_to_report(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        exporter = FakeExporter(client(), "host-a")  # heartbeat_s 1: offline after 10 s of silence
        await exporter.beat([device("b0")])
        clock.advance(300)  # the coordinator was down for five minutes, and is back now
        rules.serving_since = clock.now
        await rules.reap()
        assert (await client().get("/hosts")).json()[0]["online"], "nobody could report to a coordinator that was down"
        clock.advance(11)
        await rules.reap()
        assert not (await client().get("/hosts")).json()[0]["online"], "silent since the coordinator is back"


# The last schema in which "conflict" was a device state (migration 11 retired it), with
# flash_ops (migration 8; 15 carried them into operations): the database an upgrade opens.
OLD_VERSION = 10
OLD_BOOT = "boot-before-the-upgrade"
FLASHED = "ab" * 32


def _sql(value) -> str:
    """A value as an SQL literal that SQLite and PostgreSQL read alike."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, (int, float)):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def _insert(table: str, row: dict) -> str:
    return f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join(map(_sql, row.values()))})"


async def _run_sql(url: str, statements: list[str]) -> None:
    """``statements`` on the database at ``url`` straight through its driver (no coordinator)."""
    if url.startswith("sqlite:///"):
        connection = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            for statement in statements:
                connection.execute(statement)
        finally:
            connection.close()
        return
    connection = await asyncpg.connect(url)
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


async def _old_database(url: str, version: int, rows: list[str]) -> None:
    """A database at schema ``version``, as a coordinator of then left it: the migrations up
    to that one, through the coordinator's own migration runner, then ``rows``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store_core, "MIGRATIONS", MIGRATIONS[:version])
        old = Store(url)
        await old.connect()
        await old.disconnect()
    await _run_sql(url, rows)


async def test_a_database_of_an_older_version_is_upgraded_when_the_coordinator_opens_it(tmp_path):
    """A device left in the old state "conflict" is recomputed at its host's next report (the
    same report as before the upgrade, from the same exporter), and flashes are operations."""
    report = [device("b0"), device("b1")]
    # the digests a coordinator stores for this report: an older one stored the same, so
    # the report below changes nothing by itself (only the upgrade can make it count in full)
    (tmp_path / "scratch").mkdir()
    async with in_process_lab(tmp_path / "scratch") as (client, rules, clock):
        await FakeExporter(client(), "host-a").beat(report)
        snapshot = (await rules.hosts.hosts_sql.host("host-a"))["devices_digest"]
        digests = await rules.hosts.devices_sql.report_digests("host-a")
    now = FakeClock().now
    host = {"name": "host-a", "boot_id": OLD_BOOT, "generation": 7, "protocol": PROTOCOL_VERSION, "version": "old",
            "heartbeat_s": 1.0, "plugins": json.dumps({"loaded": ["sim"]}), "services": "[]",
            "superseded_boots": "[]", "last_seen": now - 1, "online": True, "draining": False,
            "devices_digest": snapshot, "link_lost": False}
    devices = [{"name": d["name"], "class": "sim-board", "tags": json.dumps(["sim"]), "host": "host-a",
                "state": state, "present": True, "health": "ok", "health_reason": "", "conflict_host": None,
                "reclaim_lease": None, "busy_by": "[]", "retired": False, "created_at": now - 100,
                "updated_at": now - 100, "resources": json.dumps(d["resources"]), "report_digest": digests[d["name"]],
                "log_seq": 0, "needs_recovery": None, "state_since": now - 100}
               for d, state in zip(report, ("conflict", "idle"))]
    flash = {"device": "b1", "host": "host-a", "lease_id": None, "requester": "alice", "purpose": "flash",
             "sha256": FLASHED, "image_name": "build-7", "size": 4096, "identifier": "flash:host-a:b1",
             "plugin": "flash", "boot_id": OLD_BOOT, "created_at": now - 50}
    flashes = [{**flash, "id": "op-done", "state": "done", "phase": "done", "done_bytes": 4096,
                "message": "written and verified by read-back", "seconds": json.dumps({"writing": 1.5}),
                "started_at": now - 49, "ended_at": now - 47},
               {**flash, "id": "op-queued", "state": "queued", "phase": "queued", "done_bytes": 0, "message": "",
                "seconds": "{}", "started_at": None, "ended_at": None, "created_at": now - 10}]
    image = {"sha256": FLASHED, "name": "build-7", "size": 4096, "description": "", "target": "device:b1",
             "uploader": "alice", "created_at": now - 60, "last_used_at": now - 50}
    rows = [_insert("hosts", host), *(_insert("devices", d) for d in devices),
            *(_insert("resources", {"identifier": r["identifier"], "device": d["name"], "kind": r["kind"],
                                    "plugin": r["plugin"]}) for d in report for r in d["resources"]),
            _insert("images", image), *(_insert("flash_ops", f) for f in flashes)]

    async with _database(tmp_path) as url:
        await _old_database(url, OLD_VERSION, rows)
        settings = {"reaper_interval_s": 3600, "image_dir": str(tmp_path / "images")}
        async with _lab(url, True, None, (), settings) as (client, rules, clock):  # the new coordinator opens it
            api = client()
            assert [await state_of(api, n) for n in ("b0", "b1")] == ["offline", "idle"], \
                "the old state is gone from the database at once"
            ops = (await api.get("/devices/b1/operations")).json()
            assert [(o["id"], o["kind"], o["state"], o["args"], o["image"], o["progress"], o["message"])
                    for o in sorted(ops, key=lambda o: o["id"])] == [
                ("op-done", "flash", "done", {"purpose": "flash"},
                 {"name": "build-7", "sha256": FLASHED, "size": 4096}, {"done": 4096, "total": 4096, "unit": "bytes", "detail": ""},
                 "written and verified by read-back"),
                ("op-queued", "flash", "queued", {"purpose": "flash"},
                 {"name": "build-7", "sha256": FLASHED, "size": 4096}, {"done": 0, "total": 4096, "unit": "bytes", "detail": ""},
                 "")]
            assert (await api.get("/ops/op-done")).json()["seconds"] == {"writing": 1.5}

            exporter = FakeExporter(api, "host-a")  # the exporter that reported before the upgrade, still running
            exporter.boot_id, exporter.generation = OLD_BOOT, 7
            answer = await exporter.beat(report)
            assert answer.status_code == 200, answer.text
            assert [await state_of(api, n) for n in ("b0", "b1")] == ["idle", "idle"]
            assert [(o["op"], o["kind"], o["device"], o["image"]) for o in answer.json()["operations"]] == [
                ("op-queued", "flash", "b1", {"sha256": FLASHED, "size": 4096, "name": "build-7"})], \
                "a flash queued before the upgrade is still the exporter's to run"


async def test_a_device_log_says_when_it_was_registered_and_why_it_is_faulty(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([device("b0", health="failed"), device("b1")])
        await exporter.beat([device("b0"), device("b1")])
        await exporter.beat([device("b0", health="failed"), device("b1")])
        log = [(e["from"], e["to"], e["cause"]) for e in (await api.get("/devices/b0/log")).json()]
        assert log == [
            ("unregistered", "faulty", "health failed: uart: broken (registered: first reported by host host-a)"),
            ("faulty", "idle", "health is ok again"), ("idle", "faulty", "health failed: uart: broken")]
        assert [e["cause"] for e in (await api.get("/devices/b1/log")).json()] == [
            "registered: first reported by host host-a"]


async def test_only_admins_see_the_lease_on_a_device(tmp_path):
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        made = {name: (await issue_token(rules.store, rules.clock, **spec))["token"] for name, spec in {
            "alice": {"username": "alice"}, "root": {"username": "root", "admin": True},
            "host-a": {"host": "host-a"}}.items()}
        alice, root = client(token=made["alice"]), client(token=made["root"])
        await FakeExporter(client(token=made["host-a"]), "host-a").beat([device("b0")])
        assert (await root.get("/devices/b0")).json()["lease"] is None
        lease = (await alice.post("/leases", json={"device": "b0"})).json()
        assert (await root.get("/devices/b0")).json()["lease"] == lease["id"]
        for someone in (alice, client()):  # the holder sees it under /leases; on the board nobody does
            shown = (await someone.get("/devices/b0")).json()
            assert "lease" not in shown and lease["id"] not in str(shown)


async def test_an_admin_forgets_a_device_or_host_that_will_not_come_back(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        a, b = FakeExporter(api, "host-a"), FakeExporter(api, "host-b")
        await b.beat([device("b2")])
        await a.beat([device("b0"), device("b1"), device("b2")])  # b2 is host-b's: host-a only claims it
        lease = (await api.post("/leases", json={"device": "b1"})).json()
        refused = await api.post("/admin/forget", json={"name": "b0"})
        assert refused.status_code == 409 and refused.json()["error"] == "online"
        assert "host host-a still reports it" in refused.json()["message"]

        await a.beat([device("b0"), device("b1"), device("b2")], stopping=True)  # its exporter stops
        refused = await api.post("/admin/forget", json={"name": "host-a"})
        assert refused.status_code == 409 and refused.json()["error"] == "leased"
        assert "b1 is leased by alice" in refused.json()["message"] and "admin release b1 --force" in \
            refused.json()["message"]
        assert (await api.post(f"/admin/leases/{lease['id']}/revoke")).status_code == 200
        forgot = await api.post("/admin/forget", json={"name": "b1"})
        assert forgot.json() == {"forgotten": "device", "name": "b1", "devices": ["b1"]}
        assert [(await api.get(path)).status_code for path in ("/devices/b1", "/devices/b1/log")] == [404, 404]
        assert await rules.store.read("SELECT * FROM resources WHERE device = 'b1'") == []
        assert [r["state"] for r in await rules.store.read("SELECT state FROM leases WHERE device = 'b1'")] == [
            "revoked"], "its leases stay, as history"
        gone = await api.post(f"/leases/{lease['id']}/release")
        assert gone.status_code == 409 and "b1 is no longer in the lab" in gone.json()["message"]

        forgot = await api.post("/admin/forget", json={"name": "host-a", "kind": "host"})
        assert forgot.json() == {"forgotten": "host", "name": "host-a", "devices": ["b0"]}
        assert [h["name"] for h in (await api.get("/hosts")).json()] == ["host-b"]
        assert [(d["name"], d["conflict_hosts"]) for d in (await api.get("/devices")).json()] == [("b2", [])]
        audit = [(e["action"], e["device"], e["detail"]) for e in (await api.get("/admin/audit")).json()]
        assert ("forget_host", None, {"host": "host-a", "devices": ["b0"]}) in audit
        assert ("forget", "b0", {"host": "host-a"}) in audit and ("forget", "b1", {"host": "host-a"}) in audit

        a.reboot()  # it came back after all: a new host, new devices
        await a.beat([device("b0")])
        assert [e["cause"] for e in (await api.get("/devices/b0/log")).json()] == [
            "registered: first reported by host host-a"]
        await b.beat([device("b2"), device("host-b")])
        for body, status, code in [({"name": "host-b"}, 409, "ambiguous"), ({"name": "nope"}, 404, "unknown_name"),
                                   ({"name": "host-b", "kind": "host"}, 409, "online"),
                                   ({"name": "b9", "kind": "device"}, 404, "unknown_device"),
                                   ({"name": "b0", "kind": "shelf"}, 422, "invalid"), ({"name": "a b"}, 422, "invalid"),
                                   ({}, 422, "invalid")]:
            answer = await api.post("/admin/forget", json=body)
            assert (answer.status_code, answer.json()["error"]) == (status, code), answer.text


async def test_forgetting_a_device_of_a_dead_host_ends_its_flash(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, exporter, lease = await lab_with_board(client)
        op = (await api.post(f"/leases/{lease['id']}/flash", json={"image": "build-7"})).json()
        await api.post(f"/leases/{lease['id']}/release")
        await exporter.beat([board("b1")])  # b0 unplugged mid-flash: its exporter may still be at it
        refused = await api.post("/admin/forget", json={"name": "b0"})
        assert refused.status_code == 409 and refused.json()["error"] == "flash_running"
        clock.advance(11)
        await rules.reap()  # host-a died
        assert (await api.post("/admin/forget", json={"name": "b0"})).status_code == 200
        ended = (await api.get(f"/ops/{op['id']}")).json()
        assert (ended["state"], ended["message"]) == ("failed", "its device was forgotten by admin alice")
        assert [d["name"] for d in (await api.get("/devices")).json()] == ["b1"]
