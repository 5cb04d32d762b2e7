"""Reading is never acting (docs/architecture.md, "Reading is never acting"): every GET route
of the app, the API's and the web pages', called by everyone who may, on a lab with leases, a
waiting keepalive ticket, a granted ticket nobody claimed, an image, a flash, a job and tokens,
leaves every table as it was; and a cancel of a granted ticket gives its device to the next."""
import hashlib
import re

import pytest

from conftest import SQLITE_ONLY
from device_loop.coordinator.identity import issue_token
from device_loop.core.protocol import EndpointReport, ServiceReport
from lab_in_process import FakeExporter, board, in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60), pytest.mark.usefixtures("database")]

# the same SQL runs on either database; the rule is the calls' (docs/architecture.md, "Testing")
DATABASES = SQLITE_ONLY

IMAGE = b"firmware of d0" * 64
# the event streams never end: they are read by their own tests, and write nothing (events.py
# only reads the lab); every other GET is called here
STREAMS = {"/api/v1/events"}
# the GETs that cannot answer 200 on this lab, and why (every other one does, so that each is
# seen to reach what it reads)
NOT_200_HERE = {"/api/v1/leases/{lease_id}/cdi": "a lease's CDI spec comes from its exporter's report, none here"}


async def snapshot(store) -> dict[str, list]:
    """Every row of every table, in an order of its own."""
    tables = [r["name"] for r in await store.read("SELECT name FROM sqlite_master WHERE type = 'table' "
                                                  "AND name NOT LIKE 'sqlite_%'")]
    return {table: sorted(repr(sorted(row.items())) for row in await store.read(f"SELECT * FROM {table}"))
            for table in sorted(tables)}


def changed(before: dict[str, list], after: dict[str, list]) -> dict[str, tuple[list, list]]:
    """The tables whose rows differ: (rows gone, rows new)."""
    return {t: ([r for r in before[t] if r not in after.get(t, [])],
                [r for r in after.get(t, []) if r not in before[t]]) for t in before if before[t] != after.get(t)}


async def seeded(client, rules, clock) -> dict:
    """A lab in use: alice holds d0 (served, flashed with an image) and d1; bob waits for d0
    (a keepalive ticket); carol's ticket for d2 was granted and is not claimed yet; a job; an
    admin and an exporter token. Returns the callers and the values that name what there is."""
    names = ("alice", "bob", "carol")
    people = {n: client(token=(await issue_token(rules.store, clock, n))["token"]) for n in names}
    root = client(token=(await issue_token(rules.store, clock, "root", admin=True))["token"])
    exporter_api = client(token=(await issue_token(rules.store, clock, host="host-a"))["token"])
    exporter = FakeExporter(exporter_api, "host-a")
    boards = [board(n) for n in ("d0", "d1", "d2")]
    assert (await exporter.beat(boards)).status_code == 200
    alice, bob, carol = people["alice"], people["bob"], people["carol"]
    d0 = (await alice.post("/leases", json={"device": "d0"})).json()
    service = ServiceReport(lease=d0["id"], device="d0", identifier="sim:d0", kind="uart",
                            endpoints=[EndpointReport(kind="uart", host="127.0.0.1", port=4000)])
    assert (await exporter.beat(boards, [service.model_dump(exclude_none=True)], [d0["id"]])).status_code == 200
    d2 = (await alice.post("/leases", json={"device": "d2"})).json()
    upload = await alice.post("/images", params={"name": "build-7", "for": "d0"}, content=IMAGE)
    assert upload.status_code == 201, upload.text
    op = (await alice.post(f"/leases/{d0['id']}/flash", json={"image": "build-7"})).json()
    waiting = (await bob.post("/leases", json={"device": "d0", "queue": True, "keepalive_s": 30})).json()
    granted = (await carol.post("/leases", json={"device": "d2", "queue": True})).json()
    await alice.post(f"/leases/{d2['id']}/release")
    reclaimed = await exporter.beat(boards, [service.model_dump(exclude_none=True)], [d0["id"]])
    assert reclaimed.status_code == 200  # d2 reclaimed: granted to carol
    job = await alice.post("/jobs", json={"spec": {"title": "uname", "target": {"class": "sim-board"},
                                                   "run": ["uname"], "rounds": 1}})
    assert job.status_code == 201, job.text
    state = {t["ticket"]: t["state"] for t in (await root.get("/tickets", params={"all": "true"})).json()}
    assert state == {waiting["ticket"]: "waiting", granted["ticket"]: "granted"}, state
    return {"callers": {"anyone": client(user=""), **people, "root": root, "exporter": exporter_api},
            "values": {"lease_id": [d0["id"]], "ticket_id": [waiting["ticket"], granted["ticket"]],
                       "op_id": [op["id"]], "ref": ["build-7", hashlib.sha256(IMAGE).hexdigest()],
                       "sha256": [hashlib.sha256(IMAGE).hexdigest()], "job_id": [job.json()["id"]],
                       "file": ["lab.js"], "device": ["d0"], "host": ["host-a"]},
            "tickets": (waiting, granted)}


def urls(path: str, values: dict[str, list]) -> list[str]:
    """Every URL of ``path`` with each value its parameters take (``{name}``: a device's name
    under /devices, a host's under /hosts)."""
    named = dict(values, name=values["host"] if "/hosts/" in path else values["device"])
    found = [path]
    for param in re.findall(r"\{([^}:]+)(?::[^}]*)?\}", path):
        assert param in named, f"{path}: name a value of {{{param}}} in seeded(), and call the route here"
        found = [re.sub(r"\{" + param + r"(?::[^}]*)?\}", value, url, count=1) for url in found
                 for value in named[param]]
    return found


async def test_no_get_route_changes_anything(tmp_path):
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        lab = await seeded(client, rules, clock)
        app = client.app  # type: ignore[attr-defined]
        gets = sorted({r.path for r in app.routes if "GET" in (getattr(r, "methods", None) or ())} - STREAMS)
        assert "/api/v1/tickets/{ticket_id}" in gets and "/" in gets
        before = await snapshot(rules.store)
        answered: dict[str, set[int]] = {}
        for path in gets:
            for url in urls(path, lab["values"]):
                for who, caller in lab["callers"].items():
                    for query in ({}, {"wait": "0.05"}):  # (a long-poll's wait too: where not taken, a 422)
                        answer = await caller.get("http://127.0.0.1" + url, params=query)
                        assert answer.status_code < 500, f"{who} GET {url} {query}: {answer.text[:300]}"
                        answered.setdefault(path, set()).add(answer.status_code)
                        now = await snapshot(rules.store)
                        assert now == before, f"{who} GET {url} {query} changed {changed(before, now)}"
        assert {path for path, statuses in answered.items() if 200 not in statuses} == set(NOT_200_HERE), answered


async def test_a_granted_ticket_is_claimed_only_by_its_requester_s_claim_and_a_cancel_passes_it_on(tmp_path):
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        lab = await seeded(client, rules, clock)
        carol, bob, root = (lab["callers"][n] for n in ("carol", "bob", "root"))
        waiting, granted = lab["tickets"]
        url = f"/tickets/{granted['ticket']}"
        for look in (carol.get(url), carol.get(url, params={"wait": 1}), carol.get("/tickets"), root.get(url)):
            assert (await look).status_code == 200
        assert (await carol.get(url)).json()["state"] == "granted", "reading it claimed it"
        assert (await bob.post(f"{url}/claim")).status_code == 404, "not his"
        # d2's next in line: bob queues for it too; carol cancels the grant she never claimed
        behind = (await bob.post("/leases", json={"device": "d2", "queue": True})).json()
        cancelled = (await carol.post(f"{url}/cancel")).json()
        assert cancelled["state"] == "cancelled" and cancelled["lease"]["state"] == "released"
        exporter = FakeExporter(lab["callers"]["exporter"], "host-a")
        assert (await exporter.beat([board(n) for n in ("d0", "d1", "d2")])).status_code == 200
        claimed = (await bob.post(f"/tickets/{behind['ticket']}/claim", json={"wait_s": 1})).json()
        assert claimed["state"] == "claimed" and claimed["lease"]["device"] == "d2", claimed
        again = (await bob.post(f"/tickets/{behind['ticket']}/claim")).json()
        assert again["state"] == "claimed", "claiming twice is claiming once"
