"""``reserve --image`` (docs/architecture.md, "Leases that live as long as their client"): a free
device whose latest flash wrote the image and read it back is taken first; one whose flash could
not read back, read back another digest, or was followed by another image's flash is not; the
preference never waits, and an unknown image is refused before anything is reserved. In-process,
on SQLite and PostgreSQL."""
import hashlib

import pytest

from conftest import SQLITE_ONLY
from lab_in_process import FakeExporter, board, in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60), pytest.mark.usefixtures("database")]

# the rules here run the same SQL on either database, which the store's own tests, the
# statement counts and the OpenAPI run check on PostgreSQL: SQLite only (docs/architecture.md, "Testing")
DATABASES = SQLITE_ONLY

ROOTFS = b"rootfs v2 " * 1000
OTHER = b"another build " * 1000
SHA = hashlib.sha256(ROOTFS).hexdigest()
DIGESTS = {"rootfs": SHA, "other": hashlib.sha256(OTHER).hexdigest()}
NAMES = ["b0", "b1", "b2", "b3"]


async def chunks(data: bytes):
    yield data


async def upload(api, name: str, data: bytes) -> None:
    made = await api.post("/images", params={"name": name, "for": "sim-board"}, content=chunks(data))
    assert made.status_code in (200, 201), made.text


async def flashed(api, exporter: FakeExporter, clock, name: str, image: str, result: dict | None) -> None:
    """``name`` leased, flashed with ``image`` (the exporter's report: done, with ``result``),
    released and reclaimed: idle again, the most recently of the lab's boards."""
    boards = [board(n) for n in NAMES]
    lease = (await api.post("/leases", json={"device": name})).json()
    service = {"lease": lease["id"], "device": name, "identifier": f"sim:{name}", "kind": "uart",
               "endpoints": [{"kind": "uart", "host": "127.0.0.1", "port": 4000}]}
    await exporter.beat(boards, [service], [lease["id"]])
    op = (await api.post(f"/leases/{lease['id']}/flash", json={"image": image})).json()
    report = {"op": op["id"], "device": name, "kind": "flash", "state": "done", "phase": "verifying",
              "progress": {"done": 1, "total": None, "unit": "bytes"}, "message": "written", "changed": True,
              "result": result}
    await exporter.beat(boards, [service], [lease["id"]], operations=[report])
    shown = (await api.get(f"/ops/{op['id']}")).json()
    read_back = result == {"verified": True, "sha256": DIGESTS[image]}  # (the coordinator's reading of it)
    assert shown["state"] == "done" and shown["verified"] is read_back, shown
    await api.post(f"/leases/{lease['id']}/release")
    clock.advance(1)
    await exporter.beat(boards)
    assert (await api.get(f"/devices/{name}")).json()["state"] == "idle"


async def test_a_device_already_running_the_image_verified_is_taken_first_and_none_is_waited_for(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([board(n) for n in NAMES])
        await upload(api, "rootfs", ROOTFS)
        await upload(api, "other", OTHER)
        read_back = {"verified": True, "sha256": SHA}
        await flashed(api, exporter, clock, "b0", "rootfs", {"verified": True, "sha256": "0" * 64})  # another digest
        await flashed(api, exporter, clock, "b2", "rootfs", read_back)
        await flashed(api, exporter, clock, "b2", "other", {"verified": True,  # rootfs is no longer what it runs
                                                             "sha256": hashlib.sha256(OTHER).hexdigest()})
        await flashed(api, exporter, clock, "b3", "rootfs", {"verified": False})  # fastboot: cannot read back
        await flashed(api, exporter, clock, "b1", "rootfs", read_back)  # the one idle the shortest

        taken = (await api.post("/leases", json={"class": "sim-board", "image": "rootfs"})).json()
        assert taken["device"] == "b1", taken
        by_ref = (await client("bob").post("/leases", json={"class": "sim-board", "image": SHA[:12]})).json()
        assert by_ref["device"] == "b0", "none runs it any more: the one idle the longest, at once (never waits)"
        plain = (await client("carol").post("/leases", json={"class": "sim-board"})).json()
        assert plain["device"] == "b2", "without --image: idle the longest, as before"


async def test_an_unknown_image_is_refused_before_anything_is_reserved(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        await FakeExporter(api, "host-a").beat([board(n) for n in NAMES])
        for body in ({"class": "sim-board", "image": "no-such-build"}, {"device": "b0", "image": "no-such-build"},
                     {"class": "sim-board", "image": "sha256:" + "f" * 64, "queue": True}):
            refused = await api.post("/leases", json=body)
            assert (refused.status_code, refused.json()["error"]) == (404, "unknown_image"), refused.text
        for bad in ("", "x" * 129, 7, ["rootfs"]):
            assert (await api.post("/leases", json={"class": "sim-board", "image": bad})).status_code == 422
        assert {d["state"] for d in (await api.get("/devices")).json()} == {"idle"}
        assert (await api.get("/tickets")).json() == []


async def test_the_preference_costs_one_statement_whatever_the_lab(tmp_path):
    """The image is looked up once; the preference orders the pick's one query."""
    costs = {}
    for size in (20, 200):
        async with in_process_lab(tmp_path) as (client, rules, clock):
            api = client()
            await FakeExporter(api, "host-a").beat([board(f"n{i}") for i in range(size)])
            await upload(api, "rootfs", ROOTFS)
            for key, body in (("class", {"class": "sim-board"}), ("image", {"class": "sim-board", "image": "rootfs"})):
                before = rules.store.statements
                lease = (await api.post("/leases", json=body)).json()
                costs[size, key] = rules.store.statements - before
                await api.post(f"/leases/{lease['id']}/release")
    assert costs[20, "image"] == costs[200, "image"] == costs[20, "class"] + 1, costs
