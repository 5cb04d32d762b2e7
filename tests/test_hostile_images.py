"""The image registry against hostile users and bad luck (docs/architecture.md, "Image registry", "Access"): a name never
stands for another image's digest, a file a committed row uses is never removed (two
coordinator processes racing), a full disk, a quota, a killed upload, a cut-off client."""
from __future__ import annotations

import fcntl
import hashlib
import os
import random
import signal
import socket
import struct
import subprocess
import time

import pytest

from conftest import SQLITE_ONLY, Coordinator, coordinator_pair, wait_for
from lab_in_process import FakeExporter, board, device, in_process_lab
from live_lab import LabDatabase, Spread

from device_loop.coordinator.image_files import PARTIAL_GRACE_S, ImageFiles

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]

# the rules here run the same SQL on either database, which the store's own tests, the
# statement counts and the OpenAPI run check on PostgreSQL: SQLite only (docs/architecture.md, "Testing")
DATABASES = SQLITE_ONLY
in_process = [pytest.mark.anyio, pytest.mark.usefixtures("database")]


async def upload(api, name: str, data: bytes, target: str = "b0"):
    return await api.post("/images", params={"name": name, "for": target}, content=data)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_a_name_never_stands_for_another_images_digest(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        alice, bob = client("alice"), client("bob")
        exporter = FakeExporter(alice, "host-a")
        await exporter.beat([board()])
        mine, theirs = b"alice's build" * 1000, b"bob's payload" * 1000
        assert (await upload(alice, "alice-build", mine)).status_code == 201
        listed = (await alice.get("/images")).json()[0]
        assert listed["ref"] == f"sha256:{sha(mine)[:12]}", "listings print the form that cannot be confused"

        # bob names his bytes after alice's digest, as `images ls` printed it, or whole
        for name in (sha(mine)[:12], sha(mine), sha(mine)[:8].upper()):
            refused = await upload(bob, name, theirs)
            assert refused.status_code == 422 and "looks like a sha256" in refused.json()["message"], refused.text
        assert (await upload(bob, "abc1234", theirs)).status_code == 201, "short hex names are names"

        lease = (await alice.post("/leases", json={"device": "b0"})).json()
        for ref in (sha(mine)[:12], f"sha256:{sha(mine)[:12]}", sha(mine), f"sha256:{sha(mine)}"):
            op = await alice.post(f"/leases/{lease['id']}/flash", json={"image": ref})
            assert op.status_code == 201 and op.json()["image"]["sha256"] == sha(mine), (ref, op.text)
            await exporter.beat([board()], operations=[{"op": op.json()["id"], "device": "b0", "kind": "flash", "state": "failed",
                                                     "phase": "fetching", "message": "stop", "changed": False}])
        good = await alice.post(f"/admin/images/{sha(mine)[:12]}/known-good", json={"for": "b0"})
        assert good.status_code == 200 and good.json()["name"] == "alice-build"
        assert (await alice.get(f"/images/sha256:{sha(theirs)}")).json()["name"] == "abc1234"
        for bad in ("sha256:abc", "sha256:" + "g" * 12, "sha256:" + "a" * 65):
            assert (await alice.get(f"/images/{bad}")).status_code == 422
        unknown = await alice.get(f"/images/{'0' * 64}")
        assert unknown.status_code == 404 and "no image has the sha256" in unknown.json()["message"]


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_a_vendor_digest_cannot_be_taken_by_name_before_the_vendor_image(tmp_path):
    """bob registers nothing under the published digest of vendor firmware: the admin's real
    upload goes in, and recovery writes the vendor's bytes."""
    async with in_process_lab(tmp_path) as (client, rules, clock):
        admin, bob = client("root"), client("bob")
        exporter = FakeExporter(admin, "host-a")
        await exporter.beat([board()])
        vendor = b"vendor firmware 2.1" * 5000
        squat = await upload(bob, sha(vendor), b"bob's firmware" * 100, target="sim-board")
        assert squat.status_code == 422
        made = await admin.post("/images", params={"name": "vendor-2.1", "for": "sim-board", "sha256": sha(vendor)},
                                content=vendor)
        assert made.status_code == 201, made.text
        assert (await admin.post(f"/admin/images/{sha(vendor)}/known-good", json={"for": "sim-board"})).status_code \
            == 200
        lease = (await admin.post("/leases", json={"device": "b0"})).json()
        op = (await admin.post(f"/leases/{lease['id']}/recover")).json()
        assert op["image"]["sha256"] == sha(vendor)


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_names_are_unique_per_target_and_an_ambiguous_name_is_refused_with_what_it_matched(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([board("b0"), board("b1")])
        for_b0, for_class = b"b0 only" * 100, b"every sim-board" * 100
        assert (await upload(api, "build", for_b0, "b0")).status_code == 201
        assert (await upload(api, "build", for_class, "sim-board")).status_code == 201
        taken = await upload(api, "build", b"another" * 100, "b0")
        assert taken.status_code == 409 and taken.json()["error"] == "name_taken"
        assert "sha256:" + sha(for_b0)[:12] in taken.json()["message"]

        ambiguous = await api.get("/images/build")
        assert ambiguous.status_code == 409 and ambiguous.json()["error"] == "ambiguous_image"
        for data, target in ((for_b0, "device:b0"), (for_class, "class:sim-board")):
            assert f"build for {target} (sha256:{sha(data)[:12]})" in ambiguous.json()["message"]
        both = (await api.post("/leases", json={"device": "b0"})).json()
        refused = await api.post(f"/leases/{both['id']}/flash", json={"image": "build"})
        assert refused.status_code == 409 and "names several images" in refused.json()["message"]
        one = (await api.post("/leases", json={"device": "b1"})).json()
        op = await api.post(f"/leases/{one['id']}/flash", json={"image": "build"})
        assert op.status_code == 201 and op.json()["image"]["sha256"] == sha(for_class), "only one is for b1"
        marked = await api.post("/admin/images/build/known-good", json={"for": "b0"})
        assert marked.status_code == 200 and marked.json()["sha256"] == sha(for_b0), "the one for what is marked"
        page = await api.get("http://127.0.0.1/devices/b0")
        assert f"sha256:{sha(for_b0)[:12]}" in page.text


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_a_quota_per_person_holds_and_frees_with_removal(tmp_path):
    async with in_process_lab(tmp_path, image_quota_bytes=3 << 20) as (client, rules, clock):
        alice, bob = client("alice"), client("bob")
        await FakeExporter(alice, "host-a").beat([board()])
        first = os.urandom(2 << 20)
        assert (await upload(alice, "first", first)).status_code == 201
        over = await upload(alice, "second", os.urandom(2 << 20))
        assert over.status_code == 413 and over.json()["error"] == "over_quota"
        assert "quota" in over.json()["message"] and "alice" in over.json()["message"]
        assert (await upload(bob, "bobs", os.urandom(2 << 20))).status_code == 201, "a quota is per person"
        assert [p.name for p in (tmp_path / "images").iterdir() if p.name.startswith(".upload-")] == []
        assert (await alice.post(f"/images/sha256:{sha(first)}/remove")).status_code == 200
        assert (await upload(alice, "second", os.urandom(2 << 20))).status_code == 201


def qcow2_naming(data_file: bytes) -> bytes:
    """A qcow2 (version 3) whose data lives in ``data_file``, as QEMU writes the header
    (QEMU's docs/interop/qcow2.txt): what a user uploads to have a VM read a host file."""
    header = struct.pack(">4sIQIIQIIQQIIQQQQII", b"QFI\xfb", 3, 0, 0, 16, 1 << 20, 0, 1, 1 << 16, 2 << 16, 1, 0, 0,
                         1 << 2, 0, 1, 4, 104)
    name = data_file + b"\0" * (-len(data_file) % 8)
    extension = struct.pack(">II", 0x44415441, len(data_file)) + name + struct.pack(">II", 0, 0)
    return (header + extension).ljust(4 << 16, b"\0")


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_an_image_that_names_a_host_file_is_refused_at_upload(tmp_path):
    """A qcow2 naming an external data file (or a backing file) would have QEMU open that file of
    the exporter's host: the registry keeps no such image, whatever it is uploaded for."""
    async with in_process_lab(tmp_path) as (client, rules, clock):
        alice = client("alice")
        await FakeExporter(alice, "host-a").beat([board()])
        refused = await upload(alice, "sneaky", qcow2_naming(b"/etc/device-loop/exporter.token"))
        assert refused.status_code == 422, refused.text
        assert "external data file" in refused.json()["message"] and "exporter.token" in refused.json()["message"]
        assert [p.name for p in (tmp_path / "images").iterdir()] == [] and (await alice.get("/images")).json() == []
        assert (await upload(alice, "fine", b"QFI-not-quite" + os.urandom(4096))).status_code == 201


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB filesystem (tmpfs), as a registry's disk that fills up."""
    folder = tmp_path / "small-disk"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"cannot mount a small tmpfs here: {mounted.stderr}")
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.strip()}")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_a_full_disk_is_a_507_with_nothing_kept(tmp_path, small_disk):
    async with in_process_lab(tmp_path, image_dir=str(small_disk)) as (client, rules, clock):
        api = client()
        await FakeExporter(api, "host-a").beat([board()])
        full = await upload(api, "too-big", os.urandom(3 << 20))
        assert full.status_code == 507 and full.json()["error"] == "registry_full", full.text
        assert "nothing kept" in full.json()["message"]
        assert list(small_disk.iterdir()) == [] and (await api.get("/images")).json() == []
        assert (await upload(api, "fits", os.urandom(256 << 10))).status_code == 201


def _post_head(port: int, path: str, length: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Device-Loop-User: alice\r\n"
                 f"Content-Type: application/octet-stream\r\nContent-Length: {length}\r\n\r\n".encode())
    return sock


def partials(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".upload-")) if folder.exists() else []


def test_a_sweep_takes_only_old_unlocked_temporary_files(tmp_path):
    """Another process's upload is between mkstemp and flock for an instant: its file is
    unlocked then, and a sweep must not take it (it did: os.replace then failed, a 500)."""
    files = ImageFiles(tmp_path)
    fresh = tmp_path / ".upload-fresh"
    fresh.write_bytes(b"x")
    held = tmp_path / ".upload-held"
    held.write_bytes(b"x")
    left = tmp_path / ".upload-left"
    left.write_bytes(b"x")
    long_ago = time.time() - 2 * PARTIAL_GRACE_S
    for old in (held, left):
        os.utime(old, (long_ago, long_ago))
    fd = os.open(held, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert files.sweep_partials() == [".upload-left"]
        assert fresh.exists() and held.exists() and not left.exists()
        assert files.sweep_partials(now=time.time() + 2 * PARTIAL_GRACE_S) == [".upload-fresh"]
    finally:
        os.close(fd)


def test_an_upload_cut_off_is_a_400_and_one_killed_with_its_coordinator_is_cleaned_at_start(tmp_path, env):
    coordinator = Coordinator(tmp_path, env)
    images = tmp_path / "coord" / "images"
    try:
        beat = FakeExporter(None, "host-a").report([board()])
        assert coordinator.api("/hosts/host-a/heartbeat", "POST", json=beat).status_code == 200
        # a client that goes away mid-upload: a line in the log, no traceback, nothing kept
        sock = _post_head(coordinator.port, "/api/v1/images?name=cut&for=b0", 10 << 20)
        sock.sendall(os.urandom(1 << 20))
        wait_for(lambda: partials(images), what="the upload's temporary file")
        sock.close()
        wait_for(lambda: "cut off" in coordinator.output(), what="the cut upload in the log")
        wait_for(lambda: not partials(images), what="its temporary file removed")
        assert "Traceback" not in coordinator.output() and "unexpected error" not in coordinator.output()

        # an upload whose coordinator is killed leaves its temporary file; the next start removes it
        sock = _post_head(coordinator.port, "/api/v1/images?name=killed&for=b0", 10 << 20)
        sock.sendall(os.urandom(1 << 20))
        left = wait_for(lambda: partials(images), what="the upload's temporary file")
        coordinator.stop(signal.SIGKILL)
        sock.close()
        assert partials(images) == left
        long_ago = time.time() - 2 * PARTIAL_GRACE_S  # a file younger than that may be a live upload's, unlocked yet
        for name in left:
            os.utime(images / name, (long_ago, long_ago))
        coordinator.start()
        coordinator.wait_ready()
        wait_for(lambda: not partials(images), what="the killed upload's file removed at start")
    finally:
        coordinator.stop()


def _shared_image_dir_pair(tmp_path, env, url: str, *extra: str):
    return coordinator_pair(tmp_path, env, url, "--image-dir", str(tmp_path / "shared-images"), *extra)


def _every_row_has_its_file(db: LabDatabase, images) -> None:
    for row in db.rows("SELECT sha256, name FROM images"):
        path = images / row["sha256"]
        assert path.exists(), f"image {row['name']} has a committed row and no file"
        assert hashlib.sha256(path.read_bytes()).hexdigest() == row["sha256"]


def test_two_processes_never_remove_a_file_a_committed_row_uses(tmp_path, env, postgres_database):
    with _shared_image_dir_pair(tmp_path, env, postgres_database) as procs:
        _race_uploads_and_removals(tmp_path / "shared-images", Spread(procs), LabDatabase(postgres_database))


def _race_uploads_and_removals(images, spread: Spread, db: LabDatabase) -> None:
    try:
        beat = FakeExporter(None, "host-a").report([board()])
        assert spread.request(0, "POST", "/hosts/host-a/heartbeat", json=beat).status_code == 200
        rng = random.Random(17)

        def send(via: int, name: str, data: bytes) -> int:
            return spread.request(via, "POST", "/images", params={"name": name, "for": "b0"}, content=data).status_code

        round_s = 0.0  # the longest round: the sweeps after a round's removal have run by the next one's end
        for round_ in range(40):
            began = time.monotonic()
            # the same bytes under two names through two processes: one row, and its file stays
            data = rng.randbytes(64 << 10)
            statuses = spread.at_once((send, 0, f"a-{round_}", data), (send, 1, f"b-{round_}", data))
            assert sorted(statuses) == [201, 409], statuses
            _every_row_has_its_file(db, images)
            # a removal racing a re-upload of the same bytes: a committed row keeps its file
            name = next(n for n, s in zip((f"a-{round_}", f"b-{round_}"), statuses) if s == 201)
            remove = lambda: spread.request(0, "POST", f"/images/{name}/remove").status_code  # noqa: E731
            again = lambda: send(1, f"c-{round_}", data)  # noqa: E731
            removed, uploaded = spread.at_once((remove,), (again,))
            assert removed == 200 and uploaded in (201, 409), (removed, uploaded)
            _every_row_has_its_file(db, images)
            round_s = max(round_s, time.monotonic() - began)
        # the sweeps after the last removal leave no trace to wait for: watched for two rounds' time, still true
        deadline = time.monotonic() + 2 * round_s
        while time.monotonic() < deadline:
            _every_row_has_its_file(db, images)
    finally:
        db.close()
        spread.close()


def test_the_quota_holds_under_concurrent_uploads_through_two_processes(tmp_path, env, postgres_database):
    with _shared_image_dir_pair(tmp_path, env, postgres_database, "--image-quota", "4") as procs:
        _upload_ten_against_a_quota_of_four(Spread(procs), LabDatabase(postgres_database))


def _upload_ten_against_a_quota_of_four(spread: Spread, db: LabDatabase) -> None:
    try:
        beat = FakeExporter(None, "host-a").report([board()])
        assert spread.request(0, "POST", "/hosts/host-a/heartbeat", json=beat).status_code == 200

        def send(n: int) -> int:
            return spread.request(n, "POST", "/images", params={"name": f"i{n}", "for": "b0"},
                                  content=os.urandom(1 << 20)).status_code

        statuses = spread.at_once(*[(send, n) for n in range(10)])
        assert sorted(statuses) == [201] * 4 + [413] * 6, statuses
        assert db.rows("SELECT SUM(size) AS bytes FROM images WHERE uploader = 'alice'")[0]["bytes"] == 4 << 20
    finally:
        db.close()
        spread.close()
