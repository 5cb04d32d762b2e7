"""Who gets the next lease (docs/architecture.md, "Who gets the next lease"): reserve by
class and tags, queue tickets and their order, claims and their window, driven in-process
with a hand-moved clock (on SQLite, and on PostgreSQL where the suite has one)."""
import pytest

from device_loop.coordinator.identity import issue_token
from device_loop.core.vocabulary import TokenKind
from lab_in_process import FakeExporter, device, in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60), pytest.mark.usefixtures("database")]


def board(name: str, device_class: str = "riscv-sbc", tags=("rvv",), health: str = "ok") -> dict:
    report = device(name, health=health)
    return {**report, "class": device_class, "tags": list(tags)}


async def free(exporter: FakeExporter, boards: list[dict]) -> None:
    """The exporter confirms every ended lease's services are gone: reclaimed devices turn idle."""
    assert (await exporter.beat(boards)).status_code == 200


async def test_reserve_by_class_and_tags_takes_the_free_match_idle_longest(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        boards = [board("r0"), board("r1", tags=("rvv", "8gb")), board("r2", tags=("rvv", "8gb")),
                  board("a0", "arm-sbc", ("sve2",))]
        await free(exporter, boards)
        first = (await api.post("/leases", json={"class": "riscv-sbc", "tags": ["8gb"]})).json()
        assert first["device"] == "r1", "of two idle as long, the first by name"
        await api.post(f"/leases/{first['id']}/release")
        clock.advance(5)
        await free(exporter, boards)  # r1 is idle again, now the most recently
        picks = []
        for _ in range(2):
            lease = (await api.post("/leases", json={"class": "riscv-sbc", "tags": ["rvv", "8gb"]})).json()
            picks.append(lease["device"])
        assert picks == ["r2", "r1"], "the one idle the longest first: wear spreads over the class"
        refused = await api.post("/leases", json={"class": "riscv-sbc", "tags": ["8gb"]})
        assert refused.status_code == 409 and refused.json()["error"] == "none_free"
        assert "2 allocating" in refused.json()["message"] and "--queue" in refused.json()["message"]
        missing = await api.post("/leases", json={"tags": ["avx512f"]})
        assert missing.status_code == 404 and missing.json()["error"] == "no_such_devices"
        both = await api.post("/leases", json={"device": "r0", "class": "riscv-sbc"})
        assert both.status_code == 422
        by_tag = (await api.post("/leases", json={"tags": ["sve2"]})).json()
        assert by_tag["device"] == "a0", "tags alone match any class"
        listed = (await api.get("/devices", params={"class": "riscv-sbc", "tags": "8gb"})).json()
        assert sorted(d["name"] for d in listed) == ["r1", "r2"]


async def test_a_device_that_is_not_free_is_never_picked(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        boards = [board("sick", health="failed"), board("broken"), board("gone")]
        await free(exporter, boards)
        await rules.power.devices_sql.update_device("broken", needs_recovery="a flash failed")
        await free(exporter, boards[:2])  # "gone" unplugged: offline
        states = {d["name"]: d["state"] for d in (await api.get("/devices")).json()}
        assert states == {"sick": "faulty", "broken": "idle", "gone": "offline"}
        refused = await api.post("/leases", json={"class": "riscv-sbc"})
        assert refused.status_code == 409 and refused.json()["error"] == "none_free", refused.text
        ticket = (await api.post("/leases", json={"class": "riscv-sbc", "queue": True})).json()
        assert ticket["state"] == "waiting" and ticket["position"] == 1 and ticket["kind"] == "interactive"
        await free(exporter, [board("sick"), boards[1], boards[2]])  # health back, plugged in again
        granted = (await api.post(f"/tickets/{ticket['ticket']}/claim")).json()
        assert granted["state"] == "claimed" and granted["lease"]["device"] in ("sick", "gone")
        assert granted["lease"]["device"] != "broken", "needs recovery: never picked"


async def _people_and_agents(rules, clock):
    tokens = {}
    for name, kind in (("ann", TokenKind.PERSON), ("bea", TokenKind.PERSON), ("bot1", TokenKind.AGENT),
                       ("bot2", TokenKind.AGENT), ("bot3", TokenKind.AGENT), ("root", TokenKind.PERSON)):
        made = await issue_token(rules.store, clock, name, admin=name == "root", kind=kind)
        tokens[name] = made["token"]
    return tokens


async def test_people_are_served_before_agents_first_come_first_served_and_aged_batch_among_them(tmp_path):
    async with in_process_lab(tmp_path, single_user=False, batch_max_wait_s=600) as (client, rules, clock):
        tokens = await _people_and_agents(rules, clock)
        apis = {name: client(token=token) for name, token in tokens.items()}
        exporter = FakeExporter(client(token=(await issue_token(rules.store, clock, host="host-a"))["token"]),
                                "host-a")
        await free(exporter, [board("d0")])
        held = (await apis["root"].post("/leases", json={"device": "d0"})).json()
        tickets = {}
        for name in ("bot1", "bot2", "bot3", "ann", "bea"):  # batch ones first, then the people's
            clock.advance(1)
            answer = (await apis[name].post("/leases", json={"class": "riscv-sbc", "queue": True})).json()
            tickets[name] = answer
        assert [tickets[n]["kind"] for n in ("bot1", "ann")] == ["batch", "interactive"], \
            "the kind is the token's, never the request's"
        assert tickets["bot1"]["position"] == 1, "its place when it was made"
        now = (await apis["bot1"].get(f"/tickets/{tickets['bot1']['ticket']}")).json()
        assert tickets["bea"]["position"] == 2 and now["position"] == 3, "the people went ahead of it"
        queue = (await client("nobody").get("/queue")).json()
        assert [q["requester"] for q in queue] == ["ann", "bea", "bot1", "bot2", "bot3"]
        assert all(q["ticket"] is None for q in queue), "ticket ids only to their requesters"

        served = []
        lease = held
        for turn in range(5):
            if turn == 2:
                clock.advance(600)  # bot2 and bot3 waited past the batch limit: served among people
                late = (await apis["ann"].post("/leases", json={"class": "riscv-sbc", "queue": True})).json()
                tickets["ann-again"] = late
            holder = lease["holder"]
            api = apis["ann" if holder == "ann" else holder]
            assert (await api.post(f"/leases/{lease['id']}/release")).status_code == 200
            await free(exporter, [board("d0")])
            granted = [(n, t) for n, t in tickets.items() if n not in served
                       and (await apis[n.split("-")[0]].post(f"/tickets/{t['ticket']}/claim")).json()["state"] == "claimed"]
            assert len(granted) == 1, f"turn {turn}: one ticket a free device"
            name, ticket = granted[0]
            served.append(name)
            lease = (await apis[name.split("-")[0]].post(f"/tickets/{ticket['ticket']}/claim")).json()["lease"]
            assert lease["state"] in ("pending", "active")
        assert served == ["ann", "bea", "bot1", "bot2", "bot3"], \
            "people first, first come first served; aged batch tickets before a later person's"
        audit = (await apis["root"].get("/admin/audit")).json()
        assert any(a["action"] == "reserve" and a["detail"].get("ticket") == tickets["ann"]["ticket"] for a in audit)


async def test_a_cancelled_ticket_never_gets_a_lease_and_an_unclaimed_grant_passes_on(tmp_path):
    async with in_process_lab(tmp_path, single_user=False, claim_window_s=120) as (client, rules, clock):
        people = {name: client(token=(await issue_token(rules.store, clock, name))["token"])
                  for name in ("alice", "bob", "carol", "dave")}
        alice, bob, carol = people["alice"], people["bob"], people["carol"]
        exporter = FakeExporter(client(token=(await issue_token(rules.store, clock, host="host-a"))["token"]),
                                "host-a")
        await free(exporter, [board("d0")])
        held = (await alice.post("/leases", json={"device": "d0"})).json()
        bob_ticket = (await bob.post("/leases", json={"device": "d0", "queue": True})).json()
        clock.advance(1)
        carol_ticket = (await carol.post("/leases", json={"device": "d0", "queue": True})).json()
        assert (bob_ticket["state"], bob_ticket["position"], carol_ticket["position"]) == ("waiting", 1, 2)
        assert (await carol.post(f"/tickets/{bob_ticket['ticket']}/cancel")).status_code == 404, "not hers"
        cancelled = (await bob.post(f"/tickets/{bob_ticket['ticket']}/cancel")).json()
        assert cancelled["state"] == "cancelled"
        assert (await bob.post(f"/tickets/{bob_ticket['ticket']}/cancel")).status_code == 409
        # carol's ticket is next; she does not look at it
        clock.advance(1)
        dave_ticket = (await people["dave"].post("/leases", json={"device": "d0", "queue": True})).json()
        await alice.post(f"/leases/{held['id']}/release")
        await free(exporter, [board("d0")])
        device_now = (await alice.get("/devices/d0")).json()
        assert device_now["holder"] == "carol" and device_now["state"] == "allocating"
        await exporter.serve({"id": (await rules.devices.devices_sql.device("d0"))["lease_id"], "device": "d0"})  # up, unseen
        clock.advance(121)
        await rules.reap()  # carol never claimed it: her lease ends, the device goes on
        expired = (await carol.get(f"/tickets/{carol_ticket['ticket']}")).json()
        assert expired["state"] == "expired" and "not claimed" in expired["reason"]
        assert expired["lease"]["state"] == "expired"
        await free(exporter, [board("d0")])
        dave = (await people["dave"].post(f"/tickets/{dave_ticket['ticket']}/claim")).json()
        assert dave["state"] == "claimed" and dave["lease"]["device"] == "d0"
        assert (await bob.get(f"/tickets/{bob_ticket['ticket']}")).json()["lease"] is None, "cancelled: no lease"


async def test_tickets_are_bounded_per_person_and_a_refusal_that_no_wait_cures_is_not_queued(tmp_path):
    async with in_process_lab(tmp_path, max_tickets_per_user=2) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        await free(exporter, [board("d0")])
        await client("owner").post("/leases", json={"device": "d0"})
        for _ in range(2):
            assert (await api.post("/leases", json={"device": "d0", "queue": True})).json()["state"] == "waiting"
        third = await api.post("/leases", json={"device": "d0", "queue": True})
        assert third.status_code == 409 and third.json()["error"] == "too_many_tickets"
        unknown = await api.post("/leases", json={"device": "nope", "queue": True})
        assert unknown.status_code == 404, "an unknown device is never waited for"
        nothing = await api.post("/leases", json={"class": "no-such-class", "queue": True})
        assert nothing.status_code == 404, "a class the lab does not have is never waited for"
        mine = (await api.get("/tickets")).json()
        assert [t["state"] for t in mine] == ["waiting", "waiting"]
        await api.post(f"/tickets/{mine[0]['ticket']}/cancel")
        assert (await api.post("/leases", json={"device": "d0", "queue": True})).status_code == 201, \
            "a cancelled ticket no longer counts"


async def test_metrics_count_waiting_tickets_by_class_and_kind(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        await free(FakeExporter(api, "host-a"), [board("d0")])
        await client("owner").post("/leases", json={"device": "d0"})
        await api.post("/leases", json={"class": "riscv-sbc", "queue": True})
        text = (await api.get("http://127.0.0.1/metrics")).text
        assert 'device_loop_tickets_waiting{class="riscv-sbc",kind="interactive"} 1.0' in text
