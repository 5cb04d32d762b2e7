"""Leases that live as long as their client (docs/architecture.md, "Leases that live as long as
their client"): a keepalive lease lapses unless kept alive, never past its own end; a keepalive
ticket lapses unless read, and its grant is a keepalive lease. Driven in-process with a
hand-moved clock (on SQLite, and on PostgreSQL where the suite has one)."""
import pytest

from device_loop.coordinator.identity import issue_token
from device_loop.core.durations import parse_iso
from lab_in_process import FakeExporter, device, in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60), pytest.mark.usefixtures("database")]

MAX_TTL_S = 2 * 86400.0  # the lab's maximum in these tests: not the default (7 d), nor the default ttl (30 min)
# (no exporter starts the leases' services here: a pending lease must not fail while the clock moves)
SETTINGS = {"max_ttl_s": MAX_TTL_S, "allocating_timeout_s": 3600.0}


def ahead(lease: dict, field: str) -> float:
    """How far ``lease[field]`` (a time) is after the lease's creation, in seconds."""
    return parse_iso(lease[field]) - parse_iso(lease["created_at"])


async def audit_actions(api) -> list[tuple[str, str | None]]:
    return [(e["action"], e["lease"]) for e in (await api.get("/admin/audit")).json()]


async def test_a_keepalive_lease_lapses_keepalive_ahead_and_ends_at_the_labs_maximum(tmp_path):
    async with in_process_lab(tmp_path, **SETTINGS) as (client, rules, clock):
        api = client()
        await FakeExporter(api, "host-a").beat([device("b0"), device("b1")])
        lease = (await api.post("/leases", json={"device": "b0", "keepalive_s": 30})).json()
        assert lease["keepalive_s"] == 30
        assert (ahead(lease, "expires_at"), ahead(lease, "ends_at")) == (30, MAX_TTL_S), \
            "without a ttl a keepalive lease ends at the lab's maximum, not its default"
        plain = (await api.post("/leases", json={"device": "b1", "ttl_s": 600})).json()
        assert (plain["keepalive_s"], ahead(plain, "ends_at"), ahead(plain, "expires_at")) == (None, 600, 600)

        clock.advance(20)
        kept = await api.post(f"/leases/{lease['id']}/renew", json={})  # a keep-alive: no ttl
        assert kept.status_code == 200, kept.text
        assert (ahead(kept.json(), "expires_at"), ahead(kept.json(), "ends_at")) == (50, MAX_TTL_S)
        refused = await api.post(f"/leases/{plain['id']}/renew", json={})
        assert refused.status_code == 422 and "has no keepalive" in refused.json()["message"], refused.text

        # a renewal with a ttl moves its end, and its lapse with it (never past the end)
        renewed = (await api.post(f"/leases/{lease['id']}/renew", json={"ttl_s": 10})).json()
        assert (ahead(renewed, "ends_at"), ahead(renewed, "expires_at")) == (30, 30)
        clock.advance(5)
        kept = (await api.post(f"/leases/{lease['id']}/renew", json={})).json()
        assert ahead(kept, "expires_at") == 30, "a keep-alive never passes the lease's end"
        # a keep-alive is not audited (a client sends one every few seconds); a renewal with a ttl is
        assert [a for a in await audit_actions(api) if a == ("renew", lease["id"])] == [("renew", lease["id"])]


async def test_the_reaper_ends_a_lease_whose_client_stopped_renewing_and_says_so(tmp_path):
    async with in_process_lab(tmp_path, **SETTINGS) as (client, rules, clock):
        api = client()
        await FakeExporter(api, "host-a").beat([device("b0"), device("b1")])
        silent = (await api.post("/leases", json={"device": "b0", "keepalive_s": 30})).json()
        kept = (await api.post("/leases", json={"device": "b1", "keepalive_s": 30, "ttl_s": 50})).json()
        for _ in range(2):
            clock.advance(20)
            assert (await api.post(f"/leases/{kept['id']}/renew", json={})).status_code == 200
            await rules.reap()
        assert (await api.get(f"/leases/{silent['id']}")).json()["end_reason"] == \
            "its client stopped renewing (keepalive 30s)"
        assert (await api.get(f"/leases/{kept['id']}")).json()["ended_at"] is None, "kept alive: it lives"
        clock.advance(11)  # past its own end (50 s), kept alive or not
        assert (await api.post(f"/leases/{kept['id']}/renew", json={})).status_code == 200
        await rules.reap()
        ended = (await api.get(f"/leases/{kept['id']}")).json()
        assert (ended["state"], ended["end_reason"]) == ("expired", "its ttl ran out")
        assert ("expire", silent["id"]) in await audit_actions(api)


@pytest.mark.parametrize("keepalive", [0, 4.9, 3601, 10 * 365 * 86400, -30, "30", True, None, [30], {"s": 30}])
async def test_a_keepalive_out_of_its_range_or_not_a_number_is_a_clear_422(tmp_path, keepalive):
    async with in_process_lab(tmp_path, **SETTINGS) as (client, rules, clock):
        api = client()
        await FakeExporter(api, "host-a").beat([device("b0")])
        body = {"device": "b0", "keepalive_s": keepalive}
        refused = await api.post("/leases", json=body)
        if keepalive is None:  # (null is no keepalive: a plain lease)
            assert refused.status_code == 201, refused.text
            return
        assert refused.status_code == 422, refused.text
        message = refused.json()["message"]
        assert "keepalive_s" in message, message
        if isinstance(keepalive, (int, float)) and not isinstance(keepalive, bool):
            assert "5 to 3600 seconds" in message, message
        assert (await api.get("/devices/b0")).json()["state"] == "idle", "nothing was reserved"


async def test_nan_and_infinity_are_a_clear_422(tmp_path):
    async with in_process_lab(tmp_path, **SETTINGS) as (client, rules, clock):
        api = client()
        await FakeExporter(api, "host-a").beat([device("b0")])
        for literal in ("NaN", "Infinity", "1e999"):
            refused = await api.post("/leases", content=f'{{"device": "b0", "keepalive_s": {literal}}}',
                                     headers={"Content-Type": "application/json"})
            assert refused.status_code in (400, 422) and "keepalive_s" in refused.json()["message"] or \
                refused.status_code == 400, refused.text
            assert refused.status_code < 500


async def test_a_keepalive_ticket_lapses_unless_followed_and_its_grant_is_a_keepalive_lease(tmp_path):
    async with in_process_lab(tmp_path, **SETTINGS) as (client, rules, clock):
        alice, bob, carol = client("alice"), client("bob"), client("carol")
        exporter = FakeExporter(alice, "host-a")
        await exporter.beat([device("b0")])
        held = (await alice.post("/leases", json={"device": "b0"})).json()
        asked = (await bob.post("/leases", json={"device": "b0", "queue": True, "keepalive_s": 30})).json()
        forgotten = (await carol.post("/leases", json={"device": "b0", "queue": True, "keepalive_s": 30})).json()
        assert (asked["state"], asked["keepalive_s"]) == ("waiting", 30)
        for _ in range(3):  # bob follows his ticket every 20 s; carol only reads hers (a GET keeps nothing)
            clock.advance(20)
            assert (await bob.post(f"/tickets/{asked['ticket']}/claim")).json()["state"] == "waiting"
            assert (await carol.get(f"/tickets/{forgotten['ticket']}")).status_code == 200
            await rules.reap()
        lapsed = (await carol.get(f"/tickets/{forgotten['ticket']}")).json()
        assert (lapsed["state"], lapsed["reason"]) == ("expired", "its client stopped asking (keepalive 30s)")
        assert (await bob.get(f"/tickets/{asked['ticket']}")).json()["position"] == 1, "carol's went; bob is next"
        # carol's open ticket was counted down: she may queue again as many as before
        assert (await rules.scheduler.tickets_sql.db.row("SELECT open_tickets FROM user_counts WHERE name = 'carol'")
                )["open_tickets"] == 0

        await alice.post(f"/leases/{held['id']}/release")
        await exporter.beat([device("b0")])  # reclaimed: granted to bob's ticket
        clock.advance(20)
        granted = (await bob.post(f"/tickets/{asked['ticket']}/claim")).json()  # claimed, and its lease kept
        lease = granted["lease"]
        assert (granted["state"], lease["keepalive_s"], ahead(lease, "ends_at")) == ("claimed", 30, MAX_TTL_S)
        assert parse_iso(lease["expires_at"]) == pytest.approx(clock() + 30, abs=1), "the claim kept it alive"


async def test_a_keepalive_grant_nobody_claims_lapses_with_its_lease(tmp_path):
    async with in_process_lab(tmp_path, **SETTINGS) as (client, rules, clock):
        alice, bob = client("alice"), client("bob")
        exporter = FakeExporter(alice, "host-a")
        await exporter.beat([device("b0")])
        held = (await alice.post("/leases", json={"device": "b0"})).json()
        asked = (await bob.post("/leases", json={"device": "b0", "queue": True, "keepalive_s": 10})).json()
        await alice.post(f"/leases/{held['id']}/release")
        await exporter.beat([device("b0")])
        ticket = await rules.scheduler.tickets_sql.ticket(asked["ticket"])
        assert ticket["state"] == "granted" and ticket["lapses_at"] == pytest.approx(clock() + 10)
        clock.advance(11)  # bob's client died before it claimed: well within the claim window (2 min)
        await rules.reap()
        seen = (await bob.get(f"/tickets/{asked['ticket']}")).json()
        assert (seen["state"], seen["lease"]["state"]) == ("expired", "expired"), seen
        assert seen["reason"] == "its client stopped asking (keepalive 10s)"
        assert "keepalive 10s" in seen["lease"]["end_reason"], seen["lease"]  # (its lease lapsed in the same pass)


async def test_only_its_requester_following_a_ticket_keeps_it(tmp_path):
    async with in_process_lab(tmp_path, single_user=False, **SETTINGS) as (client, rules, clock):
        tokens = {name: (await issue_token(rules.store, clock, name, admin=name == "root"))["token"]
                  for name in ("ann", "root")}
        ann, root = client(token=tokens["ann"]), client(token=tokens["root"])
        exporter = FakeExporter(client(token=(await issue_token(rules.store, clock, host="host-a"))["token"]),
                                "host-a")
        await exporter.beat([device("b0")])
        await root.post("/leases", json={"device": "b0"})
        asked = (await ann.post("/leases", json={"device": "b0", "queue": True, "keepalive_s": 30})).json()
        clock.advance(20)
        looked = await root.get(f"/tickets/{asked['ticket']}")  # an admin's look: not its client asking
        assert looked.status_code == 200 and looked.json()["state"] == "waiting"
        followed = await root.post(f"/tickets/{asked['ticket']}/claim")  # nor an admin following it
        assert followed.status_code == 200 and followed.json()["state"] == "waiting"
        clock.advance(11)
        await rules.reap()
        assert (await ann.get(f"/tickets/{asked['ticket']}")).json()["state"] == "expired"
