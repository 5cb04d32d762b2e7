"""The queue is fair, by band (docs/architecture.md, "Shares of one lab"): one requester's
many tickets are served alternately with another's one, an urgent ticket (its token's band,
set by an admin) before normal ones, and a request cannot name its band; what no device can
serve is refused at once, and a waiting ticket ends with its last device. In-process, with a
hand-moved clock, on SQLite and on PostgreSQL."""
import re
from pathlib import Path

import pytest

from device_loop.coordinator import scheduler
from device_loop.coordinator.identity import issue_token
from device_loop.coordinator.who import CallerKind, Who
from device_loop.core.ab.jobs import JobSpec
from device_loop.core.vocabulary import Band, TicketKind, TokenKind
from lab_in_process import FakeExporter, device, in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60), pytest.mark.usefixtures("database")]


def board(name: str) -> dict:
    return {**device(name), "class": "riscv-sbc", "tags": ["rvv"]}


async def set_band(rules, token_id: str, band: Band) -> None:
    """What an admin's ``admin token set TOKEN_ID --band`` writes: the token's row."""
    await rules.store.run("UPDATE tokens SET band = :b WHERE id = :id", b=band, id=token_id)


async def serve_next(rules, exporter: FakeExporter, api, lease: dict) -> dict:
    """Release ``lease`` and let the device be reclaimed: it goes to the first waiting ticket.
    The ticket row it was granted to."""
    assert (await api.post(f"/leases/{lease['id']}/release")).status_code == 200
    assert (await exporter.beat([board("d0")])).status_code == 200
    granted = [t for t in await rules.scheduler.tickets_sql.tickets_of(None, 100) if t["state"] == "granted"]
    assert len(granted) == 1, granted
    return granted[0]


async def test_one_requesters_twenty_tickets_do_not_starve_anothers_one(tmp_path):
    async with in_process_lab(tmp_path, max_tickets_per_user=0) as (client, rules, clock):
        ann, bea, root = client("ann"), client("bea"), client("root")
        exporter = FakeExporter(root, "host-a")
        await exporter.beat([board("d0")])
        lease = (await root.post("/leases", json={"device": "d0"})).json()
        anns = []
        for _ in range(20):
            clock.advance(1)
            anns.append((await ann.post("/leases", json={"class": "riscv-sbc", "queue": True})).json())
        clock.advance(1)
        beas = (await bea.post("/leases", json={"class": "riscv-sbc", "queue": True})).json()
        assert [t["position"] for t in anns[:3]] == [1, 2, 3] and beas["position"] == 2, \
            "bea's one ticket is served after ann's first, not after her twenty"
        board_order = [e["requester"] for e in (await root.get("/queue")).json()]
        assert board_order[:4] == ["ann", "bea", "ann", "ann"] and len(board_order) == 21
        assert (await ann.get(f"/tickets/{anns[1]['ticket']}")).json()["position"] == 3

        served = []
        for _ in range(3):
            ticket = await serve_next(rules, exporter, root, lease)
            served.append(ticket["requester"])
            holder = client(ticket["requester"])
            lease = (await holder.post(f"/tickets/{ticket['id']}/claim")).json()["lease"]
            root = holder
        assert served == ["ann", "bea", "ann"], "B is served second"
        clock.advance(1)
        late = (await client("cid").post("/leases", json={"class": "riscv-sbc", "queue": True})).json()
        assert late["position"] == 2, \
            "who comes late starts where the queue stands: after ann's next, before her others"


async def test_an_urgent_ticket_is_served_before_normal_ones_and_a_request_cannot_name_its_band(tmp_path):
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        made = {name: await issue_token(rules.store, clock, name, admin=name == "root", kind=kind)
                for name, kind in (("ann", TokenKind.PERSON), ("bea", TokenKind.PERSON), ("bot", TokenKind.AGENT),
                                   ("root", TokenKind.PERSON))}
        apis = {name: client(token=token["token"]) for name, token in made.items()}
        exporter = FakeExporter(client(token=(await issue_token(rules.store, clock, host="host-a"))["token"]),
                                "host-a")
        await exporter.beat([board("d0")])
        lease = (await apis["root"].post("/leases", json={"device": "d0"})).json()
        want = {"class": "riscv-sbc", "queue": True}
        raised = await apis["ann"].post("/leases", json={**want, "band": "urgent"})
        assert raised.status_code == 422 and "band" in raised.text, "a request cannot name its band"
        for name in ("ann", "bea"):
            clock.advance(1)
            assert (await apis[name].post("/leases", json=want)).json()["band"] == "normal"
        await set_band(rules, made["bot"]["id"], Band.URGENT)  # an admin's: the next call of that token has it
        clock.advance(1)
        urgent = (await apis["bot"].post("/leases", json=want)).json()
        assert (urgent["band"], urgent["kind"], urgent["position"]) == ("urgent", "batch", 1), \
            "the band before the kind: an agent's urgent ticket is ahead of people's normal ones"
        queue = (await apis["root"].get("/queue")).json()
        assert [(e["requester"], e["band"]) for e in queue] == [("bot", "urgent"), ("ann", "normal"),
                                                                ("bea", "normal")]
        first = await serve_next(rules, exporter, apis["root"], lease)
        assert first["requester"] == "bot" and first["band"] == Band.URGENT
        await set_band(rules, made["bea"]["id"], Band.BACKGROUND)
        assert (await apis["bea"].get("/tickets")).json()[0]["band"] == "normal", \
            "a ticket keeps the band it was made with"
        audit = (await apis["root"].get("/admin/audit")).json()
        assert any(a["action"] == "queue" and a["detail"].get("band") == "urgent" for a in audit)
        urgent_bot = Who("bot", CallerKind.AGENT, band=Band.URGENT)  # (its token's band, as the call reads it)
        job = await rules.jobs.submit(JobSpec.model_validate({"target": {"class": "riscv-sbc"}, "run": ["true"]}),
                                      True, None, urgent_bot, TicketKind.BATCH)
        cell = await rules.jobs.reserve(job["id"], 0, None, "riscv-sbc", [], urgent_bot)
        assert (cell["band"], cell["position"]) == ("urgent", 1), "a job's tickets have its submitter's band"


async def test_what_no_device_can_serve_is_refused_at_once_and_a_ticket_ends_with_its_last_device(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        ann, root = client("ann"), client("root")
        exporter = FakeExporter(root, "host-a")
        boards = [board("r0"), {**board("r1"), "tags": ["rvv", "8gb"]}, {**board("a0"), "class": "arm-sbc"}]
        await exporter.beat(boards)
        for name in ("r0", "r1"):
            assert (await root.post("/leases", json={"device": name})).status_code == 201
        by_class = (await ann.post("/leases", json={"class": "riscv-sbc", "queue": True})).json()
        by_tag = (await ann.post("/leases", json={"tags": ["8gb"], "queue": True})).json()
        assert by_class["state"] == by_tag["state"] == "waiting" and by_tag["estimate"]["devices"] == 1

        assert (await root.post("/admin/devices/r1/retire", json={"force": True})).status_code == 200
        ended = (await ann.get(f"/tickets/{by_tag['ticket']}")).json()
        assert ended["state"] == "cancelled" and "no device can serve it: r1" in ended["reason"], ended
        assert (await ann.get(f"/tickets/{by_class['ticket']}")).json()["state"] == "waiting", "r0 still could"
        refused = await ann.post("/leases", json={"tags": ["8gb"], "queue": True})
        assert refused.status_code == 409 and refused.json()["error"] == "none_can_serve", refused.text
        assert "retired" in refused.json()["message"]
        unknown = await ann.post("/leases", json={"tags": ["avx512f"], "queue": True})
        assert unknown.status_code == 404 and unknown.json()["error"] == "no_such_devices", \
            "what the lab never had is a wrong request, as an unknown device's name"

        await exporter.beat(boards[:2])  # a0 unplugged: offline, it comes back
        waits = (await ann.post("/leases", json={"class": "arm-sbc", "queue": True})).json()
        assert waits["state"] == "waiting" and waits["estimate"] is None, "offline counts: it waits, without a when"
        assert (await root.post("/admin/devices/r0/retire", json={"force": True})).status_code == 200
        assert (await ann.get(f"/tickets/{by_class['ticket']}")).json()["state"] == "cancelled"
        gone = await ann.post("/leases", json={"class": "riscv-sbc", "queue": True})
        assert gone.status_code == 409 and gone.json()["error"] == "none_can_serve"
        assert (await ann.get(f"/tickets/{waits['ticket']}")).json()["state"] == "waiting"


async def test_a_tickets_place_is_its_place_on_the_board_in_a_mixed_queue(tmp_path):
    """The order of service and the thing waited for are written once (store/tickets.py:
    ``_order`` in SQL, ``want_of``): the place a ticket is told and its place on the board agree
    over bands, kinds, an aged batch ticket, turns and two things waited for."""
    async with in_process_lab(tmp_path, max_tickets_per_user=0) as (client, rules, clock):
        await FakeExporter(client("root"), "host-a").beat([board("d0"), {**board("d1"), "tags": ["other"]}])
        now = clock()
        rows = []
        for n in range(16):
            row = {"id": f"tk-{n:02}", "requester": f"u{n % 3}", "kind": ("batch", "interactive")[n % 2],
                   "device": None, "device_class": "riscv-sbc", "tags": [["rvv"], ["other"]][n % 4 == 3],
                   "ttl_s": 600.0, "state": "waiting", "created_at": now - (4000 if n == 6 else 16 - n),
                   "granted_at": None, "ended_at": None, "lease_id": None, "granted_device": None, "reason": "",
                   "band": ("urgent", "normal", "background")[n % 3 if n % 5 else 1], "turn": n % 4}
            await rules.store.insert("tickets", row)
            rows.append(row)
        board_places = {e["ticket"]: e["position"] for e in await rules.scheduler.queue(Who("root", admin=True))}
        aged, tickets = rules.scheduler._aged(clock()), rules.scheduler.tickets_sql
        told = {row["id"]: await tickets.tickets_ahead(await tickets.ticket(row["id"]), aged) + 1 for row in rows}
        assert told == board_places and max(board_places.values()) == 12, "12 for one thing, 4 for another"
    coordinator = "".join(p.read_text() for p in Path(scheduler.__file__).parent.rglob("*.py"))
    assert len(re.findall(r'created_at\W*<=', coordinator)) == 1, "the order of service: written once, in SQL"
    assert len(re.findall(r'tuple\(\w+\["tags"\]\)', coordinator)) == 1, "the thing waited for: read once (want_of)"


async def test_a_grant_whose_lease_ended_before_it_was_claimed_is_not_offered(tmp_path):
    """A granted ticket whose lease an admin ended (a device retired with force) ends at the
    reaper's next pass, or at its claim if that comes first, saying why: never "held for you"
    with a lease that is gone."""
    async with in_process_lab(tmp_path) as (client, rules, clock):
        ann, root = client("ann"), client("root")
        exporter = FakeExporter(root, "host-a")
        await exporter.beat([board("r0")])
        held = (await root.post("/leases", json={"device": "r0"})).json()
        ticket = (await ann.post("/leases", json={"device": "r0", "queue": True})).json()
        await root.post(f"/leases/{held['id']}/release")
        await exporter.beat([board("r0")])  # its reclaim done: r0 goes to ann's ticket
        assert (await root.get("/tickets", params={"all": "true"})).json()[0]["state"] == "granted"
        assert (await root.post("/admin/devices/r0/retire", json={"force": True})).status_code == 200
        await rules.reap()  # (its next pass ends such a grant; a claim before it would)
        seen = (await ann.get(f"/tickets/{ticket['ticket']}")).json()
        assert seen["state"] == "cancelled" and "ended before it was claimed" in seen["reason"], seen
        assert seen["lease"]["state"] == "revoked"
        # the same, told by the claim that comes before the reaper's pass
        await exporter.beat([board("r1")])
        held = (await root.post("/leases", json={"device": "r1"})).json()
        ticket = (await ann.post("/leases", json={"device": "r1", "queue": True})).json()
        await root.post(f"/leases/{held['id']}/release")
        await exporter.beat([board("r1")])
        assert (await root.post("/admin/devices/r1/retire", json={"force": True})).status_code == 200
        claimed = (await ann.post(f"/tickets/{ticket['ticket']}/claim")).json()
        assert claimed["state"] == "cancelled" and "ended before it was claimed" in claimed["reason"], claimed
