"""Mediated flash, the coordinator's side (docs/architecture.md, "Operations", "Lifecycle"):
who may flash what, one flash a device, progress and results from heartbeats, the sticky needs_recovery and recovery."""
import hashlib

import pytest

from conftest import SQLITE_ONLY
from lab_in_process import FakeExporter, board, device, in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60), pytest.mark.usefixtures("database")]

# the rules here run the same SQL on either database, which the store's own tests, the
# statement counts and the OpenAPI run check on PostgreSQL: SQLite only (docs/architecture.md, "Testing")
DATABASES = SQLITE_ONLY

IMAGE = bytes(range(256)) * 4096  # 1 MiB
GOOD = b"known good" * 1000
SHA = hashlib.sha256(IMAGE).hexdigest()


async def chunks(data: bytes):
    yield data


async def upload(api, name: str, data: bytes, target: str = "sim-board"):
    made = await api.post("/images", params={"name": name, "for": target}, content=chunks(data))
    assert made.status_code in (200, 201), made.text
    return made.json()


def flash_report(op: dict, state: str, phase: str, done: int = 0, message: str = "", changed=None) -> dict:
    """What an exporter reports of a flash it runs (an operation of kind flash)."""
    return {"op": op["id"], "device": op["device"], "kind": "flash", "state": state, "phase": phase,
            "progress": {"done": done, "total": None, "unit": "bytes"}, "message": message,
            "changed": phase != "fetching" if changed is None else changed}


async def lab_with_board(client, lease_it: bool = True):
    """alice's client, host-a's exporter, b0's lease (its console served)."""
    api = client()
    exporter = FakeExporter(api, "host-a")
    assert (await exporter.beat([board(), board("b1")])).status_code == 200
    await upload(api, "build-7", IMAGE, target="b0")
    await upload(api, "golden", GOOD)
    assert (await api.post("/admin/images/golden/known-good", json={"for": "sim-board"})).status_code == 200
    lease = None
    if lease_it:
        lease = (await api.post("/leases", json={"device": "b0"})).json()
        service = {"lease": lease["id"], "device": "b0", "identifier": "sim:b0", "kind": "uart",
                   "endpoints": [{"kind": "uart", "host": "127.0.0.1", "port": 4000}]}
        await exporter.beat([board(), board("b1")], [service], [lease["id"]])
    return api, exporter, lease


async def test_a_flash_goes_to_the_exporter_and_its_reports_make_its_result(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, exporter, lease = await lab_with_board(client)
        status = (await api.get(f"/leases/{lease['id']}")).json()
        assert status["ready"], "a flash target is not a service: the lease is ready without one"
        made = await api.post(f"/leases/{lease['id']}/flash", json={"image": "build-7"},
                              headers={"Idempotency-Key": "k1"})
        assert made.status_code == 201, made.text
        op = made.json()
        assert (op["state"], op["device"], op["requester"], op["image"]["sha256"]) == ("queued", "b0", "alice", SHA)
        again = await api.post(f"/leases/{lease['id']}/flash", json={"image": "build-7"},
                               headers={"Idempotency-Key": "k1"})
        assert again.json()["id"] == op["id"], "a repeated Idempotency-Key returns the same operation"
        second = await api.post(f"/leases/{lease['id']}/flash", json={"image": "build-7"})
        assert second.status_code == 409 and second.json()["error"] == "flash_running"

        desired = (await exporter.beat([board(), board("b1")])).json()
        assert [(o["op"], o["kind"], o["identifier"], o["image"]["sha256"], o["image"]["size"])
                for o in desired["operations"]] == [(op["id"], "flash", "flash:host-a:b0", SHA, len(IMAGE))]
        assert all(s["kind"] != "flash" for s in desired["services"])
        fetched = await client("host-a").get(f"/hosts/host-a/images/{SHA}")
        assert fetched.status_code == 200 and fetched.content == IMAGE
        other_host = await client("host-b").get(f"/hosts/host-b/images/{SHA}")
        assert other_host.status_code == 404, "an exporter fetches only the images its own flashes write"

        impostor = FakeExporter(client("host-b"), "host-b")
        await impostor.beat([], operations=[flash_report(op, "done", "verifying", 1, "not mine")])
        assert (await api.get(f"/ops/{op['id']}")).json()["state"] == "queued", "a host speaks for its own flashes"
        desired = (await exporter.beat([board(), board("b1")],
                                       operations=[flash_report(op, "running", "writing", 4096)])).json()
        assert desired["operations"] == [], "a flash begun is the exporter's to finish, not to begin again"
        assert (await api.get(f"/leases/{lease['id']}")).json()["flashing"] == op["id"]
        running = (await api.get(f"/ops/{op['id']}")).json()
        assert (running["state"], running["phase"], running["done_bytes"]) == ("running", "writing", 4096)
        assert (await api.get("/devices/b0")).json()["image"] is None, "a flash not yet done wrote no image"
        busy = await client("bob").post("/leases", json={"device": "b0"})
        assert busy.status_code == 409
        removing = await api.post("/images/build-7/remove")
        assert removing.status_code == 409 and "being flashed" in removing.json()["message"]

        await exporter.beat([board(), board("b1")], operations=[flash_report(op, "done", "verifying", len(IMAGE),
                                                                          "written and verified")])
        done = (await api.get(f"/ops/{op['id']}")).json()
        assert (done["state"], done["message"]) == ("done", "written and verified") and done["ended_at"]
        info = (await api.get("/devices/b0")).json()
        assert (info["flashing"], info["needs_recovery"]) == (None, False)
        assert info["image"] == {"name": "build-7", "sha256": SHA}, "a fingerprint names the image last flashed"
        actions = [(a["action"], a["actor"], a["detail"].get("op")) for a in (await api.get("/admin/audit")).json()]
        assert ("flash", "alice", op["id"]) in actions and ("flash_done", "exporter:host-a", op["id"]) in actions
        history = (await client().get("/devices/b0/flashes")).json()
        assert [h["id"] for h in history] == [op["id"]]


async def test_who_may_flash_what(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, exporter, lease = await lab_with_board(client)
        bob = client("bob")
        stranger = await bob.post(f"/leases/{lease['id']}/flash", json={"image": "build-7"})
        assert stranger.status_code == 404 and stranger.json()["error"] == "unknown_lease"
        unknown = await api.post(f"/leases/{lease['id']}/flash", json={"image": "nosuch"})
        assert unknown.status_code == 404 and unknown.json()["error"] == "unknown_image"
        other = (await bob.post("/leases", json={"device": "b1"})).json()
        wrong = await bob.post(f"/leases/{other['id']}/flash", json={"image": "build-7"})
        assert wrong.status_code == 409 and "is for device:b0" in wrong.json()["message"]
        await exporter.beat([board(), device("b2")])
        no_target = (await bob.post("/leases", json={"device": "b2"})).json()
        refused = await bob.post(f"/leases/{no_target['id']}/flash", json={"image": "golden"})
        assert refused.status_code == 409 and refused.json()["error"] == "no_flash_target"
        await api.post(f"/leases/{lease['id']}/release")
        ended = await api.post(f"/leases/{lease['id']}/flash", json={"image": "build-7"})
        assert ended.status_code == 409 and ended.json()["error"] == "lease_ended"
        bad = await api.post("/leases/lease-x/flash", json={"image": "build-7", "mediated": True})
        assert bad.status_code == 422
        assert not await rules.store.read("SELECT * FROM operations"), "a refused flash leaves no operation"


async def test_a_failure_while_writing_needs_recovery_until_a_known_good_image_is_written(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, exporter, lease = await lab_with_board(client)
        devices = [board(), board("b1")]
        fetch_fail = (await api.post(f"/leases/{lease['id']}/flash", json={"image": "build-7"})).json()
        await exporter.beat(devices, operations=[flash_report(fetch_fail, "failed", "fetching", 0, "bad sha256")])
        assert not (await api.get("/devices/b0")).json()["needs_recovery"], "nothing was written yet"

        unopened = (await api.post(f"/leases/{lease['id']}/flash", json={"image": "build-7"})).json()
        await exporter.beat(devices, operations=[flash_report(unopened, "failed", "writing", 0, "cannot open", False)])
        assert not (await api.get("/devices/b0")).json()["needs_recovery"], "its backend said: not touched"

        op = (await api.post(f"/leases/{lease['id']}/flash", json={"image": "build-7"})).json()
        await exporter.beat(devices, operations=[flash_report(op, "failed", "writing", 512, "I/O error")])
        info = (await api.get("/devices/b0")).json()
        assert info["needs_recovery"] and "I/O error" in info["recovery_reason"]
        assert info["holder"] == "alice", "the holder keeps the lease"
        held = (await api.get(f"/leases/{lease['id']}")).json()
        assert held["state"] == "active" and "flash " + op["id"] in held["needs_recovery"]
        log = (await api.get("/devices/b0/log")).json()
        assert log[-1]["cause"].startswith("needs recovery: flash")

        await api.post(f"/leases/{lease['id']}/release")
        await exporter.beat(devices, applied=[])
        refused = await client("bob").post("/leases", json={"device": "b0"})
        assert refused.status_code == 409 and refused.json()["error"] == "needs_recovery"
        assert "device-loop recover b0" in refused.json()["message"]

        lease = (await api.post("/admin/devices/b0/recover")).json()  # nobody holds it: an admin may
        assert (lease["purpose"], lease["image"]["name"]) == ("recover", "golden")
        await exporter.beat(devices, operations=[flash_report(lease, "done", "verifying", len(GOOD), "ok")])
        info = (await api.get("/devices/b0")).json()
        assert not info["needs_recovery"] and info["state"] == "idle"
        assert (await client("bob").post("/leases", json={"device": "b0"})).status_code == 201


async def test_an_exporter_restart_during_a_flash_interrupts_it(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, exporter, lease = await lab_with_board(client)
        devices = [board(), board("b1")]
        op = (await api.post(f"/leases/{lease['id']}/flash", json={"image": "build-7"})).json()
        await exporter.beat(devices, operations=[flash_report(op, "running", "writing", 100)])
        exporter.reboot()
        await exporter.beat(devices)
        ended = (await api.get(f"/ops/{op['id']}")).json()
        assert ended["state"] == "failed" and "restarted during the flash" in ended["message"]
        assert (await api.get("/devices/b0")).json()["needs_recovery"]
        recovering = await api.post(f"/leases/{lease['id']}/recover")
        assert recovering.status_code == 201 and recovering.json()["image"]["name"] == "golden"
        late = await exporter.beat(devices, operations=[flash_report(op, "done", "verifying", 1, "late")])
        assert late.status_code == 200
        assert (await api.get(f"/ops/{op['id']}")).json()["state"] == "failed", "an ended operation stays ended"


async def test_recovery_needs_a_known_good_image(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([board()])
        lease = (await api.post("/leases", json={"device": "b0"})).json()
        refused = await api.post(f"/leases/{lease['id']}/recover")
        assert refused.status_code == 409 and "no image is known-good for b0" in refused.json()["message"]
