"""What a scoped token's lease may take, and its budget (docs/architecture.md, "Shares of one
lab"): classes and tags filter the pick, most leases at once and the longest lease bound it,
and a budget is held ahead, then settled. Driven in-process with a hand-moved clock (on
SQLite, and on PostgreSQL where the suite has one)."""
import json

import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from device_loop.coordinator.identity import issue_token
from device_loop.coordinator.rules import PRUNE_EVERY_S
from device_loop.core.durations import parse_iso
from device_loop.core.scopes import TokenScope
from device_loop.core.vocabulary import TokenKind
from lab_in_process import FakeExporter, device, in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60), pytest.mark.usefixtures("database")]

# (no exporter starts the leases' services here: a pending lease must not fail while the clock moves)
SETTINGS = {"allocating_timeout_s": 7 * 86400.0}
DAY = 86400.0


async def token(rules, name: str, scope: TokenScope | None = None, admin: bool = False,
                kind: TokenKind = TokenKind.PERSON) -> str:
    """A token for ``name``, scoped as an admin scopes it."""
    return (await issue_token(rules.store, rules.clock, name, admin=admin, kind=kind, scope=scope))["token"]


async def exporter_of(client, rules) -> FakeExporter:
    return FakeExporter(client(token=(await issue_token(rules.store, rules.clock, host="host-a"))["token"]), "host-a")


def board(name: str, device_class: str = "sim-board", tags=("sim",)) -> dict:
    return {**device(name), "class": device_class, "tags": list(tags)}


def has(answer: dict, **expected) -> bool:
    """Whether ``answer`` says at least ``expected``."""
    return {k: answer.get(k) for k in expected} == expected


def length(lease: dict) -> float:
    return parse_iso(lease["ends_at"]) - parse_iso(lease["created_at"])


async def audit(root, action: str) -> list[dict]:
    return [e["detail"] for e in (await root.get("/admin/audit")).json() if e["action"] == action]


async def test_a_budget_spent_to_zero_refuses_the_next_reserve_and_a_lease_ends_at_the_budgets_end(tmp_path):
    async with in_process_lab(tmp_path, single_user=False, **SETTINGS) as (client, rules, clock):
        agent = client(token=await token(rules, "bot", TokenScope(budget_s=120), kind=TokenKind.AGENT))
        root = client(token=await token(rules, "root", admin=True))
        exporter = await exporter_of(client, rules)
        await exporter.beat([board("b0"), board("b1")])

        lease = (await agent.post("/leases", json={"device": "b0", "ttl_s": 600})).json()
        assert length(lease) == 120, "a lease that would outrun the budget is granted only to the budget's end"
        assert lease["budget_capped"] is True, "and its answer says so"
        assert has((await audit(root, "reserve"))[-1], held_s=120, budget_capped=True)
        spent = await agent.post("/leases", json={"device": "b1"})
        assert spent.status_code == 403 and spent.json()["error"] == "budget_spent", spent.text
        assert spent.json()["message"] == "budget: 0 of 2 device-minutes left today; it renews at 00:00 UTC"
        assert (await agent.post("/leases", json={"class": "sim-board"})).status_code == 403, "by class too"

        clock.advance(121)
        await rules.reap()
        ended = (await agent.get(f"/leases/{lease['id']}")).json()
        assert ended["state"] == "expired" and "budget ran out" in ended["end_reason"], ended
        assert (await audit(root, "expire"))[-1] == {"used_s": 120}
        await exporter.beat([board("b0"), board("b1")])  # (its host still there)
        still = await agent.post("/leases", json={"device": "b1"})
        assert still.status_code == 403 and "0 of 2" in still.json()["message"], still.text

        clock.advance(DAY)  # the next UTC day: its budget is whole again
        await exporter.beat([board("b0"), board("b1")])
        again = await agent.post("/leases", json={"device": "b1", "ttl_s": 60})
        assert again.status_code == 201 and length(again.json()) == 60, again.text


async def test_a_lease_ended_early_gives_back_what_it_did_not_use_and_a_renewal_holds_its_extension(tmp_path):
    async with in_process_lab(tmp_path, single_user=False, **SETTINGS) as (client, rules, clock):
        agent = client(token=await token(rules, "bot", TokenScope(budget_s=600, budget_period="token")))
        root = client(token=await token(rules, "root", admin=True))
        await (await exporter_of(client, rules)).beat([board("b0"), board("b1")])

        async def budget() -> dict:
            return (await agent.get("/whoami")).json()["budget"]

        first = (await agent.post("/leases", json={"device": "b0", "ttl_s": 300})).json()
        assert has(await budget(), held_s=300, used_s=0, left_s=300, period="token", renews_at=None)
        clock.advance(60)
        released = await agent.post(f"/leases/{first['id']}/release")
        assert released.status_code == 200
        assert (await audit(root, "release"))[-1] == {"used_s": 60}
        assert has(await budget(), held_s=0, used_s=60, left_s=540)

        second = (await agent.post("/leases", json={"device": "b1", "ttl_s": 100})).json()
        clock.advance(50)
        renewed = (await agent.post(f"/leases/{second['id']}/renew", json={"ttl_s": 200})).json()
        assert parse_iso(renewed["ends_at"]) == clock.now + 200 and renewed["budget_capped"] is False
        assert has(await budget(), held_s=200, used_s=110, left_s=290)
        too_long = (await agent.post(f"/leases/{second['id']}/renew", json={"ttl_s": 1000})).json()
        assert parse_iso(too_long["ends_at"]) == clock.now + 490, "a renewal is granted only to the budget's end"
        assert too_long["budget_capped"] is True
        assert (await budget())["left_s"] == 0
        await agent.post(f"/leases/{second['id']}/release")
        assert has(await budget(), held_s=0, used_s=110, left_s=490)


async def test_scoped_classes_and_tags_filter_the_pick_and_refuse_what_is_outside_them(tmp_path):
    async with in_process_lab(tmp_path, single_user=False, **SETTINGS) as (client, rules, clock):
        scope = TokenScope(classes=("rpi4", "rock5"), tags=("lab-b", "lab-c"))
        agent = client(token=await token(rules, "bot", scope))
        await (await exporter_of(client, rules)).beat(
            [board("x0", "x86"), board("p0", "rpi4", ("lab-a",)), board("p1", "rpi4", ("lab-c", "usb")),
             board("r0", "rock5", ("lab-b",))])
        picked = []
        for _ in range(2):
            lease = await agent.post("/leases", json={"class": "rpi4"})
            if lease.status_code == 201:
                picked.append(lease.json()["device"])
        assert picked == ["p1"], "of its classes, only a device with one of its tags"
        anyone = (await agent.post("/leases", json={"needs": "real-hw"})).json()
        assert anyone["device"] == "r0", "without a class: its classes and tags filter the pick"
        for asked, named in (({"device": "x0"}, "x0 (class x86)"), ({"device": "p0"}, "p0 (tags: lab-a)"),
                             ({"class": "x86"}, "class x86")):
            refused = await agent.post("/leases", json=asked)
            assert refused.status_code == 403 and refused.json()["error"] == "out_of_scope", refused.text
            assert refused.json()["message"].startswith("scope: this token may reserve") and named in \
                refused.json()["message"]
        queued = await agent.post("/leases", json={"needs": "real-hw", "queue": True})
        assert queued.status_code == 403 and "name one of them to queue" in queued.json()["message"], queued.text


async def test_most_leases_at_once_and_the_longest_lease_bound_a_scoped_token(tmp_path):
    async with in_process_lab(tmp_path, single_user=False, **SETTINGS) as (client, rules, clock):
        agent = client(token=await token(rules, "bot", TokenScope(max_leases=1, max_lease_s=3600)))
        await (await exporter_of(client, rules)).beat([board("b0"), board("b1")])

        too_long = await agent.post("/leases", json={"device": "b0", "ttl_s": 7200})
        assert too_long.status_code == 403 and "at most 1h" in too_long.json()["message"], too_long.text
        lease = (await agent.post("/leases", json={"device": "b0", "keepalive_s": 60})).json()
        assert length(lease) == 3600, "a keepalive lease's end without a ttl: the scope's longest lease"
        second = await agent.post("/leases", json={"device": "b1"})
        assert second.status_code == 403 and second.json()["message"] == \
            "scope: this token may hold 1 lease at once; release one first"
        assert (await agent.get("/whoami")).json()["live_leases"] == 1
        clock.advance(600)
        past = await agent.post(f"/leases/{lease['id']}/renew", json={"ttl_s": 3300})
        assert past.status_code == 403 and "at the latest" in past.json()["message"], past.text
        assert (await agent.post(f"/leases/{lease['id']}/renew", json={"ttl_s": 3000})).status_code == 200

        await agent.post(f"/leases/{lease['id']}/release")
        assert (await agent.post("/leases", json={"device": "b1"})).status_code == 201, "released: room again"


async def test_a_ticket_granted_to_a_spent_budget_or_a_narrowed_scope_ends_saying_so_and_the_next_is_served(tmp_path):
    async with in_process_lab(tmp_path, single_user=False, **SETTINGS) as (client, rules, clock):
        agent = client(token=await token(rules, "bot", TokenScope(budget_s=60, max_leases=5)))
        ann = client(token=await token(rules, "ann"))
        bob = client(token=await token(rules, "bob"))
        exporter = await exporter_of(client, rules)
        await exporter.beat([board("b0"), board("b1")])
        held = (await bob.post("/leases", json={"device": "b0"})).json()
        ticket = (await agent.post("/leases", json={"device": "b0", "queue": True})).json()
        clock.advance(1)  # (the agent's ticket first)
        other = (await ann.post("/leases", json={"device": "b0", "queue": True})).json()
        assert (ticket["state"], other["state"]) == ("waiting", "waiting")
        await agent.post("/leases", json={"device": "b1", "ttl_s": 60})  # its whole budget, held

        await bob.post(f"/leases/{held['id']}/release")
        await exporter.beat([board("b0"), board("b1")])  # reclaimed: b0 is free and granted
        ended = (await agent.get(f"/tickets/{ticket['ticket']}")).json()
        assert ended["state"] == "cancelled" and ended["reason"].startswith("budget: 0 of 1 device-minutes"), ended
        assert (await ann.post(f"/tickets/{other['ticket']}/claim")).json()["state"] == "claimed", "the next one is served"
        assert (await agent.get("/whoami")).json()["live_leases"] == 1, "the refused grant counts no lease"

        # a scope an admin narrowed after the ticket was made: its grant is refused as a reserve would be
        narrowed = await issue_token(rules.store, rules.clock, "bee", scope=TokenScope(classes=("sim-board",)))
        bee = client(token=narrowed["token"])
        clock.advance(1)
        waiting = (await bee.post("/leases", json={"device": "b0", "queue": True})).json()
        await rules.store.run("UPDATE tokens SET scope = :s WHERE id = :id", id=narrowed["id"],
                              s=TokenScope(classes=("rpi4",)).model_dump_json())
        lease = (await ann.get(f"/tickets/{other['ticket']}")).json()["lease"]
        await ann.post(f"/leases/{lease['id']}/release")
        await exporter.beat([board("b0"), board("b1")])
        ended = (await bee.get(f"/tickets/{waiting['ticket']}")).json()
        assert ended["state"] == "cancelled" and "may reserve devices of class rpi4; not b0" in ended["reason"], ended


async def test_whoami_answers_an_unscoped_caller_too(tmp_path):
    async with in_process_lab(tmp_path, single_user=False, **SETTINGS) as (client, rules, clock):
        ann = client(token=await token(rules, "ann"))
        me = (await ann.get("/whoami")).json()
        assert has(me, name="ann", kind="person", admin=False, band="normal", scope=None, budget=None,
                   live_leases=None)


async def test_an_agent_sees_its_budget_over_mcp_and_admins_see_each_tokens_usage_in_metrics_and_on_the_page(
        tmp_path):
    async with in_process_lab(tmp_path, single_user=False, **SETTINGS) as (client, rules, clock):
        scope = TokenScope(classes=("sim-board",), budget_s=7200, max_leases=2)
        bearer = await token(rules, "bot", scope, kind=TokenKind.AGENT)
        await (await exporter_of(client, rules)).beat([board("b0")])
        await client(token=bearer).post("/leases", json={"device": "b0", "ttl_s": 1800})
        http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=client.app),
                                  headers={"Authorization": f"Bearer {bearer}"}, timeout=30)
        async with Client(streamable_http_client("http://127.0.0.1/mcp", http_client=http)) as agent:
            for name in ("whoami", "my_budget"):
                result = await agent.call_tool(name, {})
                me = json.loads(result.content[0].text)
                assert has(me, name="bot", kind="agent", band="normal", live_leases=1), me
                assert me["scope"]["classes"] == ["sim-board"]
                assert has(me["budget"], budget_s=7200, held_s=1800, used_s=0, left_s=5400, period="day",
                           renews_at="2027-01-16T00:00:00Z",
                           words="budget: 90 of 120 device-minutes left today; it renews at 00:00 UTC"), me

        root = client(token=await token(rules, "root", admin=True))
        metrics = (await root.get("http://127.0.0.1/metrics")).text
        token_id = me["token_id"]
        assert f'device_loop_token_device_seconds{{period="day",state="held",token="{token_id}",user="bot"}} 1800.0' \
            in metrics, metrics
        page = (await root.get("http://127.0.0.1/")).text
        row = page.split(f'<tr data-token="{token_id}">', 1)[1].split("</tr>", 1)[0]
        assert "bot" in row and "1 of 2" in row and "90 of 120 device-minutes left today" in row, row
        assert 'data-token=' not in (await client(token=bearer).get("http://127.0.0.1/")).text, "admins only"


async def test_a_scoped_reserve_and_release_cost_a_fixed_few_statements_more_than_an_unscoped_one(tmp_path):
    """The scope comes with the token's row (no statement); a budget is one conditional
    statement at the grant and one at the end, and most leases at once is a part of each on
    PostgreSQL (one more each on SQLite)."""
    async with in_process_lab(tmp_path, single_user=False, **SETTINGS) as (client, rules, clock):
        await (await exporter_of(client, rules)).beat([board("b0"), board("b1"), board("b2")])
        scopes = {"unscoped": None, "budget": TokenScope(classes=("sim-board",), budget_s=DAY),
                  "budget and leases": TokenScope(classes=("sim-board",), budget_s=DAY, max_leases=5)}
        costs = {}
        for (kind, scope), name in zip(scopes.items(), ("b0", "b1", "b2")):
            api = client(token=await token(rules, f"user-{len(costs)}", scope))
            before = rules.store.statements
            lease = (await api.post("/leases", json={"device": name})).json()
            reserved = rules.store.statements
            assert (await api.post(f"/leases/{lease['id']}/release")).status_code == 200
            costs[kind] = (reserved - before, rules.store.statements - reserved)
        plain = costs["unscoped"]
        assert costs["budget"] == (plain[0] + 1, plain[1] + 1), costs
        both = 1 if rules.store.dialect == "postgresql" else 2  # (one statement of two parts; SQLite: one writer)
        assert costs["budget and leases"] == (plain[0] + both, plain[1] + both), costs


@pytest.mark.parametrize("end", ["revoke", "unclaimed", "keepalive", "failed"])
async def test_a_hold_is_settled_however_its_lease_ends(tmp_path, end):
    """An admin's revoke, a grant nobody claimed, a keepalive lease whose client went quiet, an
    allocation whose services never came up: each gives back what was held and counts what
    the lease lasted as used."""
    settings = SETTINGS | ({"allocating_timeout_s": 50.0} if end == "failed" else {})
    async with in_process_lab(tmp_path, single_user=False, claim_window_s=30.0, **settings) as (client, rules, clock):
        agent = client(token=await token(rules, "bot", TokenScope(budget_s=3600, budget_period="token")))
        root = client(token=await token(rules, "root", admin=True))
        exporter = await exporter_of(client, rules)
        await exporter.beat([board("b0")])
        if end == "unclaimed":
            held = (await root.post("/leases", json={"device": "b0"})).json()
            ticket = (await agent.post("/leases", json={"device": "b0", "ttl_s": 600, "queue": True})).json()
            await root.post(f"/leases/{held['id']}/release")
            await exporter.beat([board("b0")])  # reclaimed: granted to the ticket, which nobody claims
            lease_id = (await root.get(f"/tickets/{ticket['ticket']}")).json()["lease"]["id"]
        else:
            asked = {"keepalive_s": 60} if end == "keepalive" else {"ttl_s": 600}
            lease_id = (await agent.post("/leases", json={"device": "b0", **asked})).json()["id"]
        me = (await agent.get("/whoami")).json()["budget"]
        assert me["held_s"] > 0 and me["used_s"] == 0, me

        clock.advance(100)
        if end == "revoke":
            assert (await root.post(f"/admin/leases/{lease_id}/revoke")).status_code == 200
        else:
            await rules.reap()
        lease = await rules.store.row("SELECT state, created_at, ended_at FROM leases WHERE id = :id", id=lease_id)
        assert lease["state"] == {"revoke": "revoked", "failed": "failed"}.get(end, "expired"), lease
        assert has((await agent.get("/whoami")).json()["budget"], held_s=0, used_s=lease["ended_at"] -
                   lease["created_at"], left_s=3600 - 100), "given back, and what it lasted counted"


async def test_days_of_usage_older_than_they_are_kept_are_pruned_by_the_reaper(tmp_path):
    async with in_process_lab(tmp_path, single_user=False, **SETTINGS) as (client, rules, clock):
        agent = client(token=await token(rules, "bot", TokenScope(budget_s=600)))
        token_id = (await agent.get("/whoami")).json()["token_id"]
        days = {"2025-01-01": "gone", "2026-06-01": "kept", "token": "kept"}  # (the lab's clock: January 2027)
        for period in days:
            await rules.store.run("INSERT INTO token_usage (token_id, period, held_s, used_s, last_hold_s) VALUES "
                                  "(:t, :p, 0, 60, 0)", t=token_id, p=period)
        clock.advance(PRUNE_EVERY_S)  # (its pruning is due)
        await rules.reap()
        left = {r["period"] for r in await rules.store.rows("SELECT period FROM token_usage WHERE token_id = :t",
                                                           t=token_id)}
        assert left == {period for period, fate in days.items() if fate == "kept"}


async def test_a_renewal_across_midnight_settles_the_old_day_and_holds_in_the_new(tmp_path):
    async with in_process_lab(tmp_path, single_user=False, **SETTINGS) as (client, rules, clock):
        agent = client(token=await token(rules, "bot", TokenScope(budget_s=3600)))
        await (await exporter_of(client, rules)).beat([board("b0")])
        clock.advance(DAY - clock.now % DAY - 100)  # 100 s before 00:00 UTC
        lease = (await agent.post("/leases", json={"device": "b0", "ttl_s": 600})).json()
        clock.advance(200)
        assert (await agent.post(f"/leases/{lease['id']}/renew", json={"ttl_s": 300})).status_code == 200
        days = {r["period"]: (r["held_s"], r["used_s"]) for r in await rules.store.rows(
            "SELECT period, held_s, used_s FROM token_usage")}
        assert sorted(days.values()) == [(0, 200), (300, 0)], days
        assert has((await agent.get("/whoami")).json()["budget"], held_s=300, used_s=0, left_s=3300)
