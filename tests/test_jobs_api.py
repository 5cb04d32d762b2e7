"""Jobs through the REST routes (docs/architecture.md, "Jobs and evidence"): submit, claim,
reserve (a lease at once, or a queue ticket), cells, runs, finish; the long-poll; a lost
worker's job failed by the reaper with its runs kept and its lease released; cancel; a
job's kind from who submitted it. In-process, with a hand-moved clock, on SQLite and on
PostgreSQL where the suite has one."""
import asyncio

import pytest

from conftest import SQLITE_ONLY
from device_loop.coordinator.identity import issue_token
from device_loop.core.vocabulary import TokenKind
from lab_in_process import FakeExporter, device, in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60), pytest.mark.usefixtures("database")]

# the rules here run the same SQL on either database, which the store's own tests, the
# statement counts and the OpenAPI run check on PostgreSQL: SQLite only (docs/architecture.md, "Testing")
DATABASES = SQLITE_ONLY

PLAIN = {"title": "uname", "target": {"class": "sim-board"}, "run": ["device-loop exec $DEVICE_LOOP_LEASE -- uname"],
         "rounds": 2}
AB = {"title": "decode", "target": {"class": "sim-board"},
      "metrics": [{"name": "decode_ms", "unit": "ms"}],
      "ab": {"baseline": ["run-workload --cost 1.0"], "patch": ["run-workload --cost 0.95"], "rounds": 6,
             "warmup": 1}}


def run(seq: int, arm: str, value: float, cell: int = 0, warmup: bool = False) -> dict:
    return {"cell": cell, "seq": seq, "arm": arm, "warmup": warmup, "started_at": 1000.0 + seq,
            "ended_at": 1000.5 + seq, "status": 0, "readings": {"temperatures": {"cpu": 40.0 + seq / 10}},
            "samples": [{"metric": "decode_ms", "value": value, "unit": "ms"}]}


async def submitted(api, spec=None, claim=True) -> dict:
    answer = await api.post("/jobs", json={"spec": spec or PLAIN, "claim": claim})
    assert answer.status_code == 201, answer.text
    return answer.json()


async def test_a_job_from_submit_to_finish(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([device("b0"), device("b1")])
        job = await submitted(api, AB, claim=False)
        assert job["state"] == "queued" and job["kind"] == "interactive" and job["owner"] == "alice"
        assert job["spec"]["ab"]["rounds"] == 6 and job["runs"] == [] and job["worker"] is None
        assert (await api.post(f"/jobs/{job['id']}/beat")).status_code == 403, "nobody claimed it yet"

        claimed = (await api.post("/jobs/claim", json={"worker": "ci-7:42"})).json()["job"]
        assert claimed["id"] == job["id"] and claimed["state"] == "running" and claimed["worker"] == "ci-7:42"
        assert (await api.post("/jobs/claim", json={})).json() == {"job": None}, "nothing else queued"

        lease = (await api.post(f"/jobs/{job['id']}/reserve", json={"cell": 0, "class": "sim-board"})).json()
        assert lease["id"].startswith("lease-") and lease["holder"] == "alice"
        other = (await api.post(f"/jobs/{job['id']}/reserve", json={"cell": 0, "device": "b1"})).json()
        queued = await api.post(f"/jobs/{job['id']}/reserve", json={"cell": 0, "class": "sim-board"})
        assert queued.status_code == 201 and queued.json()["state"] == "waiting", queued.text
        assert queued.json()["kind"] == "interactive"

        cell = {"cell": 0, "device": lease["device"], "lease_id": lease["id"],
                "fingerprint": {"device": lease["device"], "class": "sim-board", "isa": ["rvv"], "kernel": "Linux"}}
        assert (await api.post(f"/jobs/{job['id']}/cells", json=cell)).status_code == 200
        for seq, (arm, value) in enumerate([("A", 10), ("B", 9.5)] * 7):
            sent = await api.post(f"/jobs/{job['id']}/runs", json=run(seq, arm, value + seq / 100, warmup=seq < 2))
            assert sent.status_code == 201, sent.text
        assert (await api.post(f"/jobs/{job['id']}/beat")).json()["state"] == "running"

        shown = (await api.get(f"/jobs/{job['id']}")).json()
        assert [r["seq"] for r in shown["runs"]] == list(range(14))
        assert shown["cells"][0]["fingerprint"]["isa"] == ["rvv"] and shown["cells"][0]["group"] == ""
        assert [(r["lease"] is not None, r["ticket"] is not None) for r in shown["reservations"]] == \
            [(True, False), (True, False), (False, True)]
        assert shown["analysis"] is not None, "core/ab/abstats.py is there: the runs are analysed"

        evidence = await api.get(f"/jobs/{job['id']}/evidence")
        assert evidence.status_code == 200 and evidence.headers["content-type"].startswith("text/markdown")
        assert job["id"] in evidence.text and "decode_ms" in evidence.text and "run-workload --cost 0.95" in evidence.text
        done = (await api.post(f"/jobs/{job['id']}/finish", json={"state": "done"})).json()
        assert done["state"] == "done" and done["reason"] and done["ended_at"]
        for held in (lease, other):
            assert (await api.get(f"/leases/{held['id']}")).json()["state"] == "released"
        assert (await api.get(f"/tickets/{queued.json()['ticket']}")).json()["state"] == "cancelled"
        assert (await api.get("/jobs")).json()[0]["state"] == "done"
        actions = [(a["action"], a["detail"].get("job")) for a in await rules.devices.audit()]
        for action in ("job_submit", "job_claim", "job_finish"):
            assert (action, job["id"]) in actions


async def test_a_queued_ticket_of_a_job_is_granted_and_ends_with_the_job(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([device("b0")])
        mine = (await api.post("/leases", json={"device": "b0"})).json()
        job = await submitted(api)
        ticket = (await api.post(f"/jobs/{job['id']}/reserve", json={"class": "sim-board"})).json()
        assert ticket["state"] == "waiting" and ticket["requester"] == "alice"
        await api.post(f"/leases/{mine['id']}/release")
        await exporter.beat([device("b0")])  # reclaimed: the ticket is granted the device
        assert (await api.post(f"/jobs/{job['id']}/beat")).status_code == 200  # (and claims the grant)
        granted = (await api.post(f"/tickets/{ticket['ticket']}/claim")).json()
        assert granted["state"] == "claimed" and granted["lease"]["device"] == "b0"
        cancelled = (await api.post(f"/jobs/{job['id']}/cancel")).json()
        assert cancelled["state"] == "cancelled" and cancelled["reason"] == "cancelled by alice"
        assert (await api.get(f"/leases/{granted['lease']['id']}")).json()["state"] == "released"


async def test_the_long_poll_answers_at_the_first_change_of_state(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, worker = client(), client()
        job = await submitted(api, claim=False)
        waiting = asyncio.create_task(api.get(f"/jobs/{job['id']}", params={"wait": 30, "unless": "queued"}))
        claiming = asyncio.create_task(worker.post("/jobs/claim", json={"wait_s": 30}))
        assert (await claiming).json()["job"]["id"] == job["id"]
        seen = (await waiting).json()
        assert seen["state"] == "running"
        later = asyncio.create_task(api.get(f"/jobs/{job['id']}", params={"wait": 30, "unless": "running"}))
        await worker.post(f"/jobs/{job['id']}/finish", json={"state": "failed", "reason": "setup failed"})
        assert (await later).json()["state"] == "failed"
        ended = await api.get(f"/jobs/{job['id']}", params={"wait": 30})  # an ended job: no change is coming
        assert ended.json()["reason"] == "setup failed"


async def test_a_claim_waits_for_a_job_to_be_queued(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        claiming = asyncio.create_task(api.post("/jobs/claim", json={"wait_s": 30}))
        while not rules.life.notifier._events:  # the claim is waiting on the queue's key
            await asyncio.sleep(0.005)
        job = await submitted(api, claim=False)
        assert (await claiming).json()["job"]["id"] == job["id"]


async def test_a_lost_worker_fails_its_job_keeps_its_runs_and_releases_its_lease(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([device("b0")])
        job = await submitted(api)
        lease = (await api.post(f"/jobs/{job['id']}/reserve", json={"device": "b0"})).json()
        await exporter.serve(lease)  # (else it fails for its services not coming up)
        await api.post(f"/jobs/{job['id']}/runs", json=run(0, "run", 1.0))
        clock.advance(20)
        await api.post(f"/jobs/{job['id']}/beat")
        clock.advance(20)
        await rules.reap()
        assert (await api.get(f"/jobs/{job['id']}")).json()["state"] == "running", "it beat 20 s ago"
        clock.advance(11)
        await rules.reap()
        lost = (await api.get(f"/jobs/{job['id']}")).json()
        assert lost["state"] == "failed" and lost["reason"].startswith("worker lost")
        assert [r["seq"] for r in lost["runs"]] == [0]
        assert (await api.get(f"/leases/{lease['id']}")).json()["state"] == "released"
        refused = await api.post(f"/jobs/{job['id']}/runs", json=run(1, "run", 1.0))
        assert refused.status_code == 409 and refused.json()["error"] == "job_not_running"
        assert ("job_worker_lost", job["id"]) in [(a["action"], a["detail"].get("job"))
                                                  for a in await rules.devices.audit()]


async def test_a_restarted_coordinator_gives_workers_their_timeout_to_beat_again(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        job = await submitted(api)
        clock.advance(3600)  # the coordinator was down: nobody could beat
        rules.serving_since = clock()
        await rules.reap()
        assert (await api.get(f"/jobs/{job['id']}")).json()["state"] == "running"
        clock.advance(31)
        await rules.reap()
        assert (await api.get(f"/jobs/{job['id']}")).json()["state"] == "failed"


async def test_a_jobs_kind_is_its_submitters(tmp_path):
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        tokens = {name: (await issue_token(rules.store, clock, name, kind=kind))["token"]
                  for name, kind in (("ann", TokenKind.PERSON), ("bot", TokenKind.AGENT))}
        ann, bot = client(token=tokens["ann"]), client(token=tokens["bot"])
        await FakeExporter(client(token=(await issue_token(rules.store, clock, host="host-a"))["token"]),
                           "host-a").beat([device("b0")])
        await ann.post("/leases", json={"device": "b0"})
        assert (await submitted(ann, claim=False))["kind"] == "interactive"
        job = await submitted(bot)
        assert job["kind"] == "batch"
        ticket = (await bot.post(f"/jobs/{job['id']}/reserve", json={"device": "b0"})).json()
        assert ticket["kind"] == "batch" and ticket["requester"] == "bot"
        # through MCP (the tool's caller is batch, whatever its token)
        from device_loop.coordinator.calls import BY_NAME, Ctx
        from device_loop.coordinator.who import Who
        from device_loop.coordinator.job_schemas import SubmitJobIn

        ctx = Ctx(rules, Who("ann"), asyncio.Event().wait, 30, via_tool=True)
        by_tool = await BY_NAME["submit_job"].run(ctx, SubmitJobIn.model_validate({"spec": PLAIN}))
        assert by_tool["kind"] == "batch" and by_tool["state"] == "queued"


async def test_an_admins_shared_worker_serves_named_users(tmp_path):
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        t = {name: (await issue_token(rules.store, clock, name, admin=name == "root"))["token"]
             for name in ("ann", "bea", "root")}
        ann, bea, root = (client(token=t[n]) for n in ("ann", "bea", "root"))
        first = await submitted(bea, claim=False)
        clock.advance(1)
        await submitted(ann, claim=False)
        refused = await ann.post("/jobs/claim", json={"users": ["bea"]})
        assert refused.status_code == 403
        taken = (await root.post("/jobs/claim", json={"users": ["ann", "bea"]})).json()["job"]
        assert taken["id"] == first["id"] and taken["owner"] == "bea", "the oldest queued job first"
        assert (await bea.post(f"/jobs/{first['id']}/beat")).status_code == 403, "bea is not its worker"
        assert (await bea.get(f"/jobs/{first['id']}")).status_code == 200
        assert (await ann.get(f"/jobs/{first['id']}")).status_code == 404
        assert [j["id"] for j in (await root.get("/jobs", params={"all": "true"})).json()][-1] == first["id"]


async def test_a_job_without_a_title_is_listed_as_what_it_runs(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        untitled_ab = {k: v for k, v in AB.items() if k != "title"}
        untitled = {k: v for k, v in PLAIN.items() if k != "title"}
        ab, plain = await submitted(api, untitled_ab), await submitted(api, untitled)
        titles = {j["id"]: j["title"] for j in (await api.get("/jobs")).json()}
        assert titles[ab["id"]] == "A/B: run-workload --cost 1.0 vs run-workload --cost 0.95"
        assert titles[plain["id"]] == "device-loop exec $DEVICE_LOOP_LEASE -- uname"
