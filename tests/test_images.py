"""The image registry: content-addressed uploads, known-good marks, removal and clean-up."""
import asyncio
import hashlib

import pytest

from lab_in_process import FakeExporter, device, in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60), pytest.mark.usefixtures("database")]

IMAGE = bytes(range(256)) * 4096  # 1 MiB
SHA = hashlib.sha256(IMAGE).hexdigest()


async def chunks(data: bytes, size: int = 65536):
    for start in range(0, len(data), size):
        yield data[start:start + size]


def files(tmp_path):
    return sorted(p.name for p in tmp_path.glob("images/*"))


async def files_become(tmp_path, expected: list[str], timeout: float = 5.0) -> None:
    """A removed image's file goes once its removal committed (a sweep right after): wait for it."""
    deadline = asyncio.get_running_loop().time() + timeout
    while files(tmp_path) != expected:
        assert asyncio.get_running_loop().time() < deadline, f"files: {files(tmp_path)}, expected {expected}"
        await asyncio.sleep(0.01)


async def upload(api, data=IMAGE, **query):
    query = {"name": "jupiter-v1", "for": "b0", **query}
    return await api.post("/images", params=query, content=chunks(data))


async def test_an_upload_is_stored_once_by_its_digest(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        await FakeExporter(api, "host-a").beat([device("b0")])
        made = await upload(api, sha256=SHA, size=str(len(IMAGE)), description="first build")
        assert made.status_code == 201, made.text
        image = made.json()
        assert (image["sha256"], image["size"], image["for"], image["uploader"]) == (SHA, len(IMAGE), "device:b0",
                                                                                     "alice")
        assert (tmp_path / "images" / SHA).read_bytes() == IMAGE and files(tmp_path) == [SHA]
        again = await upload(api)
        assert again.status_code == 200 and again.json()["sha256"] == SHA and files(tmp_path) == [SHA]
        assert (await api.get("/images/jupiter-v1")).json()["sha256"] == SHA
        assert (await api.get(f"/images/{SHA}")).json()["name"] == "jupiter-v1"
        assert (await api.get(f"/images/{SHA[:12]}")).json()["name"] == "jupiter-v1", "as listings print it"
        assert (await api.get(f"/images/{SHA[:6]}")).status_code == 404, "too short to be a digest's start"
        assert [i["name"] for i in (await api.get("/images", params={"device": "b0"})).json()] == ["jupiter-v1"]
        other = await upload(api, data=IMAGE[:1000])  # another image, the same name
        assert other.status_code == 409 and "another image for device:b0 is called" in other.json()["message"]
        assert files(tmp_path) == [SHA], "a refused upload leaves nothing behind"


@pytest.mark.parametrize("query, status, code", [
    ({"sha256": "0" * 64}, 422, "checksum_mismatch"),
    ({"size": "12"}, 422, "size_mismatch"),
    ({"for": "nothing-like-it"}, 404, "unknown_target"),
    ({"name": "no spaces"}, 422, "invalid"),
    ({"sha256": "abc"}, 422, "invalid"),
])
async def test_a_bad_upload_is_refused_and_nothing_is_kept(tmp_path, query, status, code):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        await FakeExporter(api, "host-a").beat([device("b0")])
        refused = await upload(api, **query)
        assert (refused.status_code, refused.json()["error"]) == (status, code), refused.text
        assert refused.json()["message"] and files(tmp_path) == [] and (await api.get("/images")).json() == []


async def test_an_image_over_the_limit_is_refused_while_it_streams(tmp_path):
    async with in_process_lab(tmp_path, max_image_bytes=100_000) as (client, rules, clock):
        api = client()
        await FakeExporter(api, "host-a").beat([device("b0")])
        refused = await upload(api)
        assert refused.status_code == 413 and "100000 bytes" in refused.json()["message"]
        assert files(tmp_path) == []


async def test_a_file_the_registry_has_no_row_for_is_adopted_then_swept_once_its_pin_is_old(tmp_path):
    """A file in the registry's folder that no row names (left by an earlier version, or a crash
    between the file and its row) gets a row pinned now: the sweep leaves it for FILE_PIN_S,
    then takes it (its SQL differs on each database: a list parameter as rows)."""
    from device_loop.coordinator.images import FILE_PIN_S
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        await FakeExporter(api, "host-a").beat([device("b0")])
        await upload(api)
        left = [hashlib.sha256(b"left %d" % n).hexdigest() for n in range(3)]
        for sha256 in left:
            (tmp_path / "images" / sha256).write_bytes(b"left behind")
        assert await rules.images.sweep_files() == [], "adopted and pinned: nothing taken yet"
        assert set(left) <= await rules.images.images_sql.image_file_names()
        clock.advance(FILE_PIN_S + 1)
        assert sorted(await rules.images.sweep_files()) == sorted(left)
        assert files(tmp_path) == [SHA], "the uploaded image's file stays"


async def test_known_good_images_are_kept_and_the_rest_is_collected(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        alice, bob = client("alice"), client("bob")
        await FakeExporter(alice, "host-a").beat([device("b0")])
        await upload(alice)
        await upload(alice, data=IMAGE[::-1], name="jupiter-v2")
        good = await alice.post("/admin/images/jupiter-v1/known-good", json={"for": "b0"})
        assert good.status_code == 200 and good.json()["known_good_for"] == ["device:b0"]
        assert (await bob.post("/images/jupiter-v2/remove")).status_code == 403  # not bob's
        refused = await alice.post("/images/jupiter-v1/remove")
        assert refused.status_code == 409 and "only known-good image for device:b0" in refused.json()["message"]

        clock.advance(40 * 86400)
        collected = (await alice.post("/admin/images/gc", json={"unused_days": 30})).json()
        assert collected["removed"] == ["jupiter-v2"]
        await files_become(tmp_path, [SHA])

        await upload(alice, data=IMAGE[:5000], name="jupiter-v3")
        await alice.post("/admin/images/jupiter-v3/known-good", json={"for": "sim-board"})  # a class
        await alice.post("/admin/images/jupiter-v3/known-good", json={"for": "b0"})
        removed = await alice.post("/images/jupiter-v1/remove")  # v3 is known-good for b0 now
        assert removed.status_code == 200
        await files_become(tmp_path, [hashlib.sha256(IMAGE[:5000]).hexdigest()])
        actions = [a["action"] for a in (await alice.get("/admin/audit")).json()]
        assert {"image_upload", "image_known_good", "image_gc", "image_remove"} <= set(actions)
